"""The rewards an evaluation scores every image with, and which of them each model was trained on.

Metrics are reward callbacks written as in a training config (``{class_path, init_args}`` under
``trainer.callbacks``), from three places: the base config, each checkpoint's run config, and ``--held_out`` (a
YAML file in the same format, or a class path). A reward is **trained** for a model when that model's run config
gives it a non-zero weight; for that model every other metric is **held-out**: a weight of 0 in a training config
(a reward logged, not optimised) marks one held-out as well. A LoRA folder has no run config: its trained rewards
are the base config's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from flowrl.evaluation.sources import BASE, Source, read_config
from flowrl.rewards.base import RewardCallback
from flowrl.rewards.function import import_callable


@dataclass
class Metrics:
    """The reward callbacks in scoring order and ``trained[model]``: the names of the rewards each model was
    trained on (the base has none)."""

    rewards: list[RewardCallback] = field(default_factory=list)
    trained: dict[str, list[str]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def kind(self, metric: str, model: str) -> str:
        """``trained`` or ``held-out`` for a tuned model; ``-`` for the base."""
        if model == BASE:
            return "-"
        return "trained" if metric in self.trained.get(model, []) else "held-out"


def callback_specs(config: Any) -> list[dict]:
    """The ``{class_path, init_args}`` entries of ``trainer.callbacks`` (a training config), of ``callbacks``, or of
    a bare list."""
    if isinstance(config, dict):
        config = (config.get("trainer") or {}).get("callbacks", config.get("callbacks"))
    specs = [{"class_path": c} if isinstance(c, str) else c for c in (config or [])]
    return [s for s in specs if isinstance(s, dict) and "class_path" in s]


def reward_specs(config: Any, where: str) -> tuple[list[dict], list[str]]:
    """The reward callbacks among ``config``'s callbacks (other callbacks, such as checkpoints, are left out), and
    the problems of the entries that cannot be imported."""
    specs, problems = [], []
    for spec in callback_specs(config):
        try:
            cls = import_callable(spec["class_path"])
        except (ImportError, ValueError) as err:
            problems.append(f"{where}: {err}")
            continue
        if isinstance(cls, type) and issubclass(cls, RewardCallback):
            specs.append({"class_path": spec["class_path"], "init_args": dict(spec.get("init_args") or {})})
    return specs, problems


def normalized(spec: dict) -> tuple[str, dict]:
    """A reward spec as ``(class name, every init argument but the weight)``, defaults filled in, so that two
    configs naming one reward compare equal whether or not they spell out the defaults."""
    cls = import_callable(spec["class_path"])
    bound = inspect.signature(cls).bind_partial(**spec["init_args"])
    bound.apply_defaults()
    arguments = {k: v for k, v in bound.arguments.items() if k != "weight"}
    return cls.__name__, arguments


def build(spec: dict, where: str) -> tuple[Optional[RewardCallback], list[str]]:
    """The reward callback of ``spec`` (no weights load: rewards load them in ``setup``) or the problem."""
    try:
        return import_callable(spec["class_path"])(**spec["init_args"]), []
    except Exception as err:  # a reward validates its options in __init__ with its own error types
        return None, [f"{where}: {spec['class_path']} cannot be built: {type(err).__name__}: {err}"]


def held_out_specs(value: str) -> tuple[list[dict], list[str]]:
    """``--held_out`` as reward specs: a YAML file of callbacks, or one reward's class path (default options)."""
    path = Path(value).expanduser()
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            return [], [f"--held_out {value} does not exist (relative paths start at {Path.cwd()})"]
        try:
            config = read_config(path)
        except Exception as err:  # yaml's and omegaconf's errors share no base class worth naming
            return [], [f"--held_out {value} cannot be read: {err}"]
        specs, problems = reward_specs(config, f"--held_out {value}")
        if not specs and not problems:
            problems = [f"--held_out {value} lists no reward callback; write them as in a training config, under "
                        "trainer.callbacks (or callbacks): - class_path: flowrl.rewards.DigitAlignment"]
        return specs, problems
    specs, problems = reward_specs([value], f"--held_out {value}")
    if not specs and not problems:
        problems = [f"--held_out {value} is not a reward callback class; give a class path such as "
                    "flowrl.rewards.DigitAlignment, or a YAML file of reward callbacks"]
    return specs, problems


def gather_metrics(base: dict, base_path: Any, sources: list[Source],
                   held_out: list[str]) -> tuple[Metrics, list[str]]:
    """Every metric, built, with each model's trained rewards, and the problems (a reward that cannot be built, or
    two different rewards under one name)."""
    problems: list[str] = []
    places: list[tuple[str, Optional[str], list[dict]]] = []  # (where, whose run it is: None for --held_out, specs)
    for where, owner, config in [(str(base_path), BASE, base),
                                 *[(str(s.config_path), s.name, s.config) for s in sources if s.config]]:
        specs, wrong = reward_specs(config, where)
        places.append((where, owner, specs))
        problems += wrong
    for value in held_out:
        specs, wrong = held_out_specs(value)
        places.append((f"--held_out {value}", None, specs))
        problems += wrong
    metrics, seen = Metrics(), {}
    for where, owner, specs in places:
        for spec in specs:
            reward, wrong = build(spec, where)
            problems += wrong
            if reward is None:
                continue
            if owner is not None and reward.weight != 0:
                metrics.trained.setdefault(owner, []).append(reward.name)
            key = normalized(spec)
            if reward.name in seen and seen[reward.name][1] != key:
                problems.append(f"{where}: reward {reward.name!r} differs from the one of that name in "
                                f"{seen[reward.name][0]}; give one of them another init_args.name")
            elif reward.name not in seen:
                seen[reward.name] = (where, key)
                metrics.rewards.append(reward)
    base_trained = metrics.trained.pop(BASE, [])
    for source in sources:  # a LoRA folder has no run config: trained as the base config says
        metrics.trained[source.name] = metrics.trained.get(source.name, list(base_trained) if source.config is None
                                                           else [])
    return metrics, problems
