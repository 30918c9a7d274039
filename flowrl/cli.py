"""``python -m flowrl {fit,validate,test,predict}``: LightningCLI with omegaconf interpolation; ``python -m flowrl
export --ckpt CKPT --out DIR [--merged]`` writes a trained policy for diffusers (``flowrl.policies.export``).

``parser_mode="omegaconf+"`` resolves interpolations after command-line overrides are applied (plain
``omegaconf`` resolves them per file and then ignores an override of a referenced key); absolute interpolation
paths are made relative so ``${data.group_size}`` works from inside a nested class's ``init_args``.
Cross-component problems are collected and raised together before any class (and so any weight) is loaded.
A ``null`` override of a key inside a nested class (``--model.init_args.policy.init_args.lora=null``) is passed on
as a one-key config layer, in place: jsonargparse turns such a command-line ``null`` into the string ``'None'``.
``predict`` takes short options (``--prompts``, ``--seeds``, ...; :mod:`flowrl.predict_command`) and writes images
with :class:`flowrl.callbacks.ImageWriter`. The console shows the run: :class:`flowrl.callbacks.RunHeader` at the
start, :class:`flowrl.callbacks.RunProgressBar`, and :mod:`flowrl.framework_notices` filters what is not the run's.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any, Optional

from jsonargparse import set_parsing_settings
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

import flowrl.framework_notices  # noqa: F401  first: its filters must be in place before diffusers is imported
from flowrl.callbacks.image_writer import ImageWriter
from flowrl.callbacks.progress import RunProgressBar
from flowrl.callbacks.run_header import RunHeader
from flowrl.data import GroupLayout, PromptDataModule, load_prompts
from flowrl.hub import model_problems
from flowrl.log_versions import launched_as_rank_zero, share_log_versions
from flowrl.methods.base import BaseModule
from flowrl.methods.strategy_problems import strategy_problems

TRAINER_DEFAULTS: dict[str, Any] = {
    "use_distributed_sampler": False,  # the group sampler already splits batches over ranks
    "log_every_n_steps": 1,
    "enable_model_summary": False,  # flowrl.callbacks.RunHeader prints the parameters trained, with the run's setup
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
    method = _class(model["class_path"]) if model.get("class_path") else BaseModule
    problems += getattr(method, "option_problems", BaseModule.option_problems)(**_as_dict(model.get("init_args")))
    init_args = _as_dict(model.get("init_args"))
    policy = _as_dict(init_args.get("policy"))
    if isinstance(_as_dict(policy.get("init_args")).get("model"), str):
        problems += model_problems(policy["init_args"]["model"], "model.init_args.policy.init_args.model")
    trainer = _as_dict(config.get("trainer"))
    world = world_size(trainer)
    data = _as_dict(config.get("data"))
    layout = GroupLayout(1, data.get("num_groups", 4), data.get("group_size", 8), world or 1,
                         data.get("spread_groups", True))
    problems += layout.problems(getattr(method, "min_group_size", 2)) + schedule_problems(init_args, trainer, layout.local_batch_size)
    if trainer.get("use_distributed_sampler"):
        problems.append("trainer.use_distributed_sampler=true would re-split the GRPO groups; set it to false")
    for key in ("prompts", "val_prompts"):
        if isinstance(source := data.get(key), str) and not Path(source).expanduser().is_file():
            repository = Path(__file__).resolve().parents[1]  # a shipped config's prompts, run from elsewhere
            fix = (f"run from {repository} or pass --data.{key}={repository / source}"
                   if (repository / source).is_file() else "give a .txt/.jsonl file or a list of prompts")
            problems.append(f"data.{key}={source!r} does not exist (relative paths start at {Path.cwd()}); {fix}")
    if ckpt := config.get("ckpt_path"):
        problems += checkpoint_problems(str(ckpt))
    return problems + strategy_problems(config, method, world, _count_prompts(data.get("val_prompts")))


def _count_prompts(source: Any) -> int:
    try:
        return len(load_prompts(source)) if source is not None else 0
    except (OSError, ValueError):  # reported above as its own problem
        return 0


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


def schedule_problems(init_args: dict, trainer: dict, local_batch_size: int) -> list[str]:
    """Optimizer steps per batch against ``trainer.max_steps`` and against what one rank's batch can be split into.

    >>> schedule_problems({"num_minibatches": 2}, {"max_steps": 3}, 8)  # doctest: +ELLIPSIS
    ['trainer.max_steps=3 is not a multiple of the 2 optimizer steps ... use 2 or 4']
    >>> schedule_problems({"num_minibatches": 1000, "num_steps": 4}, {"max_steps": 2000}, 8)[0][:65]
    'model.num_minibatches=1000 exceeds the at most 32 trained (sample'
    """
    problems = []
    per_batch = init_args.get("num_inner_epochs", 1) * init_args.get("num_minibatches", 1)
    max_steps = trainer.get("max_steps", -1)
    if isinstance(max_steps, int) and max_steps > 0 and per_batch > 0 and max_steps % per_batch:
        lower, upper = max_steps // per_batch * per_batch, -(-max_steps // per_batch) * per_batch
        problems.append(f"trainer.max_steps={max_steps} is not a multiple of the {per_batch} optimizer steps each "
                        f"batch takes (model.num_inner_epochs x model.num_minibatches), so the run would stop "
                        f"after {upper}; use {' or '.join(str(v) for v in sorted({lower, upper}) if v > 0)}")
    pairs = local_batch_size * init_args.get("num_steps", 10)  # an upper bound: every step of every sample trained
    if init_args.get("num_minibatches", 1) > pairs > 0:
        problems.append(f"model.num_minibatches={init_args['num_minibatches']} exceeds the at most {pairs} trained "
                        f"(sample, step) pairs of one rank's batch ({local_batch_size} samples x "
                        f"{init_args.get('num_steps', 10)} steps); each minibatch needs at least one, so lower it")
    return problems


def checkpoint_problems(path: str) -> list[str]:
    """A ``--ckpt_path`` that cannot be a checkpoint: missing, empty, or a file that is not a ``torch.save`` zip
    (Lightning's special values ``last``/``best``/``hpc``/``registry`` and sharded checkpoint folders pass).

    >>> checkpoint_problems("/no/such.ckpt")  # doctest: +ELLIPSIS
    ["ckpt_path='/no/such.ckpt' does not exist; ..."]
    """
    if path in ("last", "best", "hpc", "registry") or path.startswith("registry:"):
        return []
    file = Path(path).expanduser()
    if not file.exists():
        return [f"ckpt_path={path!r} does not exist; pass an existing .ckpt (e.g. "
                "runs/<name>/version_N/checkpoints/last.ckpt), or leave ckpt_path out"]
    fix = "pass an earlier step's checkpoint from the same folder, or leave ckpt_path out"
    if file.is_file() and file.stat().st_size == 0:
        return [f"ckpt_path={path!r} is empty (0 bytes: a save that was cut off); {fix}"]
    if file.is_file() and not zipfile.is_zipfile(file):
        return [f"ckpt_path={path!r} is not a complete checkpoint (not a torch.save zip archive: truncated or "
                f"another kind of file); {fix}"]
    return []


def predict_problems(config: Any) -> list[str]:
    """Problems of a parsed ``predict`` config found before any weight loads: prompts that cannot be read."""
    data = _as_dict(config.get("data"))
    source = data.get("predict_prompts") if data.get("predict_prompts") is not None else data.get("val_prompts")
    if source is None:
        return ["predict needs prompts: --prompts \"a prompt\" ..., --prompt_file FILE, or data.val_prompts in the "
                "config"]
    if isinstance(source, str) and not Path(source).expanduser().is_file():
        return [f"prompts {source!r} do not exist (relative paths start at {Path.cwd()}); give a .txt/.jsonl file or "
                "a list of prompts"]
    return []


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
        if self.subcommand == "predict" and (problems := predict_problems(config)):
            raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
        if self.subcommand != "fit":
            return
        if problems := config_problems(config):
            raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
        share_log_versions(config.get("trainer", {}).get("logger"), rank_zero=launched_as_rank_zero())

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters right after parsing, before any hook of ours: a 0-byte
        # or cut-off file would surface as torch's bare EOFError or zip error
        config = self.config.get(self.config.get("subcommand") or "", self.config)
        if ckpt := config.get("ckpt_path"):
            if problems := checkpoint_problems(str(ckpt)):
                raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
        super()._parse_ckpt_path()

    def parse_arguments(self, parser, args) -> None:
        # main(args) hands LightningCLI its own arguments; the caller's sys.argv (a test runner's, a script's) is not
        # a second command line, which is all Lightning's warning about seeing both is for
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, args)

    def instantiate_trainer(self, **kwargs: Any):
        trainer = self.config_init.get(self.subcommand, self.config_init).get("trainer")
        callbacks = list(trainer.get("callbacks") or [])
        if trainer.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(RunProgressBar())
        if self.subcommand == "fit" and not any(isinstance(c, RunHeader) for c in callbacks):
            callbacks.append(RunHeader())
        if self.subcommand == "predict":
            ckpt = self.config_init.get(self.subcommand, self.config_init).get("ckpt_path")
            for c in callbacks:  # saves nothing in predict; pointed at the run's folder, its restored state agrees
                if isinstance(c, ModelCheckpoint) and c.dirpath is None and ckpt and Path(ckpt).is_file():
                    c.dirpath = os.path.realpath(Path(ckpt).expanduser().parent)
            if not any(isinstance(c, BasePredictionWriter) for c in callbacks):
                callbacks.append(ImageWriter())
            # predict logs no metric, and Lightning's loggers would still write hyperparameters into the run's
            # version folder (a fit config pins it) and clear its metrics.csv: the images' folder is the output
            self.save_config_callback, trainer["logger"] = None, False
        trainer["callbacks"] = callbacks
        return super().instantiate_trainer(**kwargs)

    def before_fit(self) -> None:
        # the CSV writer of a fresh version starts while the folder is still empty: Lightning warns about (and would
        # delete) an older metrics.csv when it finds the folder non-empty, which here only means TensorBoard's events
        if launched_as_rank_zero():
            for logger in self.trainer.loggers:
                if isinstance(logger, CSVLogger):
                    logger.experiment  # noqa: B018


def main(args: Optional[list[str]] = None) -> None:
    from_argv = args is None
    args = sys.argv[1:] if from_argv else args
    if args[:1] == ["export"]:  # not a LightningCLI subcommand: a trained policy -> diffusers files
        from flowrl.policies.export import main as export

        return export(args[1:])
    if args[:1] == ["predict"]:  # LightningCLI's predict, reached through short options
        from flowrl.predict_command import predict_arguments

        args = predict_arguments(args[1:])
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    args = null_overrides_as_configs(args)
    if from_argv:  # LightningCLI reads sys.argv itself, and warns when given args beside a command line
        sys.argv[1:], args = args, None
    try:
        FlowRLCLI(BaseModule, PromptDataModule, subclass_mode_model=True, trainer_defaults=TRAINER_DEFAULTS,
                  parser_kwargs={"parser_mode": "omegaconf+"}, save_config_kwargs={"overwrite": True},
                  args=args)
    except SIGTERMException as stop:  # Lightning stops (and checkpoints, if configured) and exits 0: a scheduler
        raise SystemExit(128 + signal.SIGTERM) from stop  # would read success; the shell's code for SIGTERM instead
