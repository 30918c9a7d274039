"""``python -m flowrl {fit,validate,test,predict}``: LightningCLI with omegaconf interpolation; ``python -m flowrl
export --ckpt CKPT --out DIR [--merged]`` writes a trained policy for diffusers (``flowrl.policies.export``).

``parser_mode="omegaconf+"`` resolves interpolations after command-line overrides are applied (plain
``omegaconf`` resolves them per file and then ignores an override of a referenced key); absolute interpolation
paths are made relative so ``${data.group_size}`` works from inside a nested class's ``init_args``.
Cross-component problems are collected and raised together before any class (and so any weight) is loaded.
A ``null`` override of a key inside a nested class (``--model.init_args.policy.init_args.lora=null``) is passed on
as a one-key config layer, in place: jsonargparse turns such a command-line ``null`` into the string ``'None'``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningCLI

from flowrl.data import GroupLayout, PromptDataModule
from flowrl.methods.grpo_loop import GRPOLoop
from flowrl.methods.options import option_problems

TRAINER_DEFAULTS: dict[str, Any] = {
    "use_distributed_sampler": False,  # the group sampler already splits batches over ranks
    "log_every_n_steps": 1,
}


def _class(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _as_dict(node: Any) -> dict:
    return node.as_dict() if hasattr(node, "as_dict") else dict(node or {})


def config_problems(config: Any) -> list[str]:
    """Problems that span components of a parsed (not yet instantiated) ``fit`` config."""
    from flowrl.rewards.base import RewardCallback

    problems = []
    callbacks = config.get("trainer", {}).get("callbacks") or []
    rewards = [c for c in callbacks if isinstance(c, dict) or hasattr(c, "class_path")]
    reward_paths = [c["class_path"] for c in map(_as_dict, rewards)
                    if issubclass(_class(c["class_path"]), RewardCallback)]
    if not reward_paths:
        problems.append("trainer.callbacks has no reward callback; add one, e.g. "
                        "`- class_path: flowrl.rewards.DigitAlignment`")
    model = _as_dict(config.get("model"))
    # a method with options of its own checks them (and the loop's) with its class attribute `option_problems`
    method = _class(model["class_path"]) if model.get("class_path") else GRPOLoop
    problems += getattr(method, "option_problems", option_problems)(**_as_dict(model.get("init_args")))
    data = _as_dict(config.get("data"))
    layout = GroupLayout(1, data.get("num_groups", 4), data.get("group_size", 8), 1, data.get("spread_groups", True))
    problems += layout.problems()
    if config.get("trainer", {}).get("use_distributed_sampler"):
        problems.append("trainer.use_distributed_sampler=true would re-split the GRPO groups; set it to false")
    return problems


def null_overrides_as_configs(args: list[str]) -> list[str]:
    """Rewrites ``--a.init_args.b=null`` (or ``--a.init_args.b null``) into ``--config {a: {init_args: {b: null}}}``
    at the same position, so later arguments still override it.

    >>> null_overrides_as_configs(["fit", "--model.init_args.policy.init_args.lora=null", "--trainer.max_steps=2"])
    ['fit', '--config', '{model: {init_args: {policy: {init_args: {lora: null}}}}}', '--trainer.max_steps=2']
    >>> null_overrides_as_configs(["--model.init_args.beta", "null", "--data.seed=null"])
    ['--config', '{model: {init_args: {beta: null}}}', '--data.seed=null']
    """
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if not eq and i + 1 < len(args):
            value = args[i + 1]
        if key.startswith("--") and ".init_args." in key and value == "null":
            layer = "null"
            for part in reversed(key[2:].split(".")):
                layer = f"{{{part}: {layer}}}"
            out += ["--config", layer]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    return out


class FlowRLCLI(LightningCLI):
    """The flowrl command line; see ``python -m flowrl fit --help``."""

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if self.subcommand != "fit":
            return
        if problems := config_problems(config):
            raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))


def main(args: Optional[list[str]] = None) -> None:
    from_argv = args is None
    args = sys.argv[1:] if from_argv else args
    if args[:1] == ["export"]:  # not a LightningCLI subcommand: a trained policy -> diffusers files
        from flowrl.policies.export import main as export

        return export(args[1:])
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    args = null_overrides_as_configs(args)
    if from_argv:  # LightningCLI reads sys.argv itself, and warns when given args beside a command line
        sys.argv[1:], args = args, None
    FlowRLCLI(GRPOLoop, PromptDataModule, subclass_mode_model=True, trainer_defaults=TRAINER_DEFAULTS,
              parser_kwargs={"parser_mode": "omegaconf+"}, save_config_kwargs={"overwrite": True},
              args=args)
