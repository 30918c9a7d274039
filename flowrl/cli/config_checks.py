"""Checks of a ``fit`` or ``predict`` run before any weight loads. Two stages, raised together by the CLI:
:func:`config_problems` reads the parsed config for what must be known before anything is built (the files it names:
prompts, the model and reward folders, the checkpoint; the accelerator; a reward callback at all);
:func:`built_problems` and :func:`flowrl.cli.run_checks.run_problems` read the built objects, which cost nothing to
build (a policy reads only its configs): the method's options (every class's ``problems()``), the batch geometry from
the data module and the method's ``rollout_cost()``, the schedule, then the checkpoint, the prompt records, the
rewards and the strategy against them. Each problem names the key and the fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from jsonargparse import ArgumentParser

from flowrl.checkpoints.fit import checkpoint_fit_problems, resume_step_problems
from flowrl.checkpoints.paths import checkpoint_problems
from flowrl.cli.machine_checks import accelerator_problems
from flowrl.cli.reward_checks import reward_model_problems
from flowrl.config_nodes import as_dict, class_at, plain, with_defaults
from flowrl.data import GroupLayout, PromptDataModule
from flowrl.methods.base import BaseModule
from flowrl.methods.downsample import group_size_problems
from flowrl.model_paths import MODEL_KEY, model_problems


def config_problems(config: Any) -> list[str]:
    """Problems of a parsed (not yet built) ``fit`` config that must be known before anything is built: the
    files it names (a reward's model folder too: several rewards resolve it when built), the accelerator."""
    from flowrl.rewards.base import RewardCallback

    problems = []
    callbacks = config.get("trainer", {}).get("callbacks") or []
    rewards = [c for c in callbacks if isinstance(c, dict) or hasattr(c, "class_path")]
    reward_paths = []
    for node in map(as_dict, rewards):
        cls = class_at(node.get("class_path"))
        if isinstance(cls, type) and issubclass(cls, RewardCallback):
            reward_paths.append(node["class_path"])
            problems += cls.config_problems(as_dict(node.get("init_args")))
    if not reward_paths:
        problems.append("trainer.callbacks has no reward callback; add one, e.g. "
                        "`- class_path: flowrl.rewards.DigitAlignment`")
    policy = as_dict(as_dict(as_dict(config.get("model")).get("init_args")).get("policy"))
    if isinstance(as_dict(policy.get("init_args")).get("model"), str):
        problems += model_problems(policy["init_args"]["model"], MODEL_KEY)
    trainer = as_dict(config.get("trainer"))
    problems += accelerator_problems(trainer)  # a GPU config on a machine without one
    data = with_defaults(PromptDataModule, config.get("data"))  # every data option, the declared default where unset
    if trainer.get("use_distributed_sampler"):
        problems.append("trainer.use_distributed_sampler=true would re-split the GRPO groups; set it to false")
    for key in ("prompts", "val_prompts"):
        if isinstance(source := data.get(key), str) and not Path(source).expanduser().is_file():
            repository = Path(__file__).resolve().parents[2]  # a shipped config's prompts, run from elsewhere
            fix = (f"run from {repository} or pass --data.{key}={repository / source}"
                   if (repository / source).is_file() else "give a .txt/.jsonl file or a list of prompts")
            problems.append(f"data.{key}={source!r} does not exist (relative paths start at {Path.cwd()}); {fix}")
    if ckpt := config.get("ckpt_path"):
        problems += checkpoint_problems(str(ckpt)) or resume_step_problems(str(ckpt), trainer.get("max_steps", -1))
    return problems + reward_model_problems(config)


def built_problems(method: BaseModule, data: Any, world: int, max_steps: Optional[int]) -> list[str]:
    """Problems of the built method against the data options (the data module, or its parsed options) over
    ``world`` processes, before any weight loads: every problem of the method's options (``all_problems()``), the
    batch geometry (samples per rollout: the method's ``rollout_cost()``, once its options are sound), the rows PODS
    keeps of a group (``downsample_to``) and the optimizer steps against ``trainer.max_steps``."""
    problems = method.all_problems()
    samples = 1 if problems else method.rollout_cost()[0]
    problems += layout_problems(data, type(method), world, samples)
    geometry = layout(data, world, samples)
    problems += group_size_problems(getattr(method, "downsample_to", None), geometry.group_size)
    if not problems:
        problems += schedule_problems(method, max_steps, geometry.local_batch_size)
    return problems


def policy_stand_in(node: Any) -> Any:
    """What the checks read of a policy that could not be built (its options refused, its model folder missing),
    from its parsed config ``{class_path, init_args}``: an object whose class is named as the policy's, with the
    options the config gives it that the method's checks read (``lora``, Wan's ``guidance_scale_2``), its class's
    ``prediction``, ``conditioning_images`` and ``denoiser_kind``, and a video policy's ``num_frames`` (the declared
    default where unset). The checks that need its configs (the guidance kind, a clip's token count) are left out.

    >>> policy = policy_stand_in({"class_path": "flowrl.policies.WanI2VPolicy", "init_args": {"num_frames": 9}})
    >>> type(policy).__name__, policy.conditioning_images, policy.num_frames, hasattr(policy, "lora")
    ('WanI2VPolicy', 1, 9, False)
    """
    node = as_dict(node)
    cls, given = class_at(node.get("class_path")), as_dict(node.get("init_args"))
    attributes = {k: given[k] for k in ("lora", "guidance_scale_2") if k in given}
    if isinstance(predicts := getattr(cls, "prediction", None), str):
        attributes["prediction"] = predicts  # the family's, a class attribute: what the method's sampler reads
    attributes["conditioning_images"] = getattr(cls, "conditioning_images", 0)
    if isinstance(kind := getattr(cls, "denoiser_kind", None), str):
        attributes["denoiser_kind"] = kind  # the family's denoiser class: whether it can split a clip
    if isinstance(cls, type) and (frames := with_defaults(cls, given).get("num_frames")) is not None:
        attributes["num_frames"] = frames
    return type(getattr(cls, "__name__", "Policy"), (SimpleNamespace,), {})(**attributes)


def method_without_policy(cls: type, init_args: Any) -> BaseModule:
    """Method ``cls`` built from its parsed ``init_args`` (nested classes built by jsonargparse) without its policy,
    which could not be built: in its place :func:`policy_stand_in`. Raises
    :class:`~flowrl.methods.option_surface.MethodOptionsError`."""
    init_args = plain(init_args) or {}
    policy = policy_stand_in(init_args.get("policy"))
    init_args = {k: v for k, v in init_args.items() if k != "policy"}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "method", skip={"policy"}, instantiate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jsonargparse deprecates instantiate_classes (LightningCLI's call too)
        options = vars(parser.instantiate_classes(parser.parse_object({"method": init_args})).method)
    return cls(policy, **options)


def layout(data: Any, world: int, samples: int = 1) -> GroupLayout:
    """The groups of one batch over ``world`` processes (``data``: the data module, or its parsed options)."""
    get = data.get if isinstance(data, dict) else lambda key: getattr(data, key)
    return GroupLayout(1, get("num_groups"), get("group_size"), world, get("spread_groups"),
                       samples_per_rollout=samples)


def layout_problems(data: Any, method: type, world: int, samples: int = 1) -> list[str]:
    """Problems of the batch geometry of method class ``method`` (``samples``: what one rollout scores)."""
    return layout(data, world, samples).problems(getattr(method, "min_group_size", 2), method.__name__)


def world_size(trainer: dict) -> Optional[int]:
    """Processes the trainer config asks for, where the config says (an int or a list of devices, times nodes).

    >>> world_size({"devices": 2, "num_nodes": 2}), world_size({"devices": [0, 1]}), world_size({"devices": "auto"})
    (4, 2, None)
    """
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1) or 1
    if isinstance(devices, str) and devices.isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    return devices * nodes if isinstance(devices, int) and devices > 0 and isinstance(nodes, int) else None


def schedule_problems(method: Any, max_steps: Optional[int], local_batch_size: int) -> list[str]:
    """Optimizer steps per batch of ``method`` (its ``num_inner_epochs`` x ``num_minibatches``; one for a method
    without them) against ``trainer.max_steps`` and against what one rank's batch can be split into.

    >>> from types import SimpleNamespace as N
    >>> schedule_problems(N(num_minibatches=2, num_steps=10), 3, 8)  # doctest: +ELLIPSIS
    ['trainer.max_steps=3 is not a multiple of the 2 optimizer steps ... use 2 or 4']
    >>> schedule_problems(N(num_minibatches=1000, num_steps=4), 2000, 8)[0][:65]
    'model.num_minibatches=1000 exceeds the at most 32 trained (sample'
    """
    problems = []
    minibatches, num_steps = getattr(method, "num_minibatches", 1), method.num_steps
    per_batch = getattr(method, "num_inner_epochs", 1) * minibatches
    if isinstance(max_steps, int) and max_steps > 0 and per_batch > 0 and max_steps % per_batch:
        lower, upper = max_steps // per_batch * per_batch, -(-max_steps // per_batch) * per_batch
        problems.append(f"trainer.max_steps={max_steps} is not a multiple of the {per_batch} optimizer steps each "
                        f"batch takes (model.num_inner_epochs x model.num_minibatches), so the run would stop "
                        f"after {upper}; use {' or '.join(str(v) for v in sorted({lower, upper}) if v > 0)}")
    pairs = local_batch_size * num_steps  # an upper bound: every step of every sample trained
    if minibatches > pairs > 0:
        problems.append(f"model.num_minibatches={minibatches} exceeds the at most {pairs} trained (sample, step) "
                        f"pairs of one rank's batch ({local_batch_size} samples x {num_steps} steps); each minibatch "
                        "needs at least one, so lower it")
    return problems


def predict_problems(config: Any) -> list[str]:
    """Problems of a parsed ``predict`` config found before any weight loads: a checkpoint that does not fit the
    config's method and policy, prompts that cannot be read."""
    model = as_dict(config.get("model"))
    if (ckpt := config.get("ckpt_path")) and model.get("class_path") and not checkpoint_problems(str(ckpt)):
        fit = checkpoint_fit_problems(str(ckpt), class_at(model["class_path"]),
                                      as_dict(model.get("init_args")).get("policy"), "predict")
        if fit:
            return fit
    data = as_dict(config.get("data"))
    source = data.get("predict_prompts") if data.get("predict_prompts") is not None else data.get("val_prompts")
    if source is None:
        return ["predict needs prompts: --prompts \"a prompt\" ..., --prompt_file FILE, or data.val_prompts in the "
                "config"]
    if isinstance(source, str) and not Path(source).expanduser().is_file():
        return [f"prompts {source!r} do not exist (relative paths start at {Path.cwd()}); give a .txt/.jsonl file or "
                "a list of prompts"]
    return []  # the records against the policy: on the built data module and policy (FlowRLCLI)
