"""What ``python -m flowrl evaluate`` will do, read and checked before any weight loads (:func:`plan`): the
checkpoints, their run configs and base models, the suite, the metrics, the options and the processes, every problem
reported at once with its fix."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from flowrl.config_nodes import as_dict, class_at, with_defaults
from flowrl.data import PromptDataModule
from flowrl.evaluation.features import feature_problems
from flowrl.evaluation.metrics import Metrics, gather_metrics
from flowrl.evaluation.sources import Source, base_problems, policy_spec, read_config, read_sources
from flowrl.evaluation.suites import Suite, load_suite


@dataclass
class Plan:
    """Everything an evaluation needs, read and checked, no weight loaded."""

    base: dict
    base_path: Any
    base_lora: Optional[Path]
    sources: list[Source]
    suite: Suite
    metrics: Metrics
    num_steps: int
    guidance_scale: float
    prompts_per_batch: int


def option_problems(opts: argparse.Namespace) -> list[str]:
    """Problems of the options alone (no file read).

    >>> from flowrl.cli.evaluate import parser
    >>> option_problems(parser().parse_args(["--seeds", "1", "1", "--num_steps", "0", "--confidence", "95"]))
    ... # doctest: +NORMALIZE_WHITESPACE
    ['--seeds 1 1: each seed once (a repeated seed draws the same image twice)', '--num_steps 0: must be at least 1',
     '--confidence 95.0: a fraction between 0 and 1, e.g. 0.95']
    """
    problems = []
    if len(set(opts.seeds)) != len(opts.seeds):
        problems.append(f"--seeds {' '.join(map(str, opts.seeds))}: each seed once (a repeated seed draws the same "
                        "image twice)")
    for name in ("num_steps", "batch_size", "resamples"):
        if getattr(opts, name) is not None and getattr(opts, name) < 1:
            problems.append(f"--{name} {getattr(opts, name)}: must be at least 1")
    for name in ("grid_prompts", "grid_seeds"):
        if getattr(opts, name) < 0:
            problems.append(f"--{name} {getattr(opts, name)}: must be 0 or more")
    if not 0 < opts.confidence < 1:
        problems.append(f"--confidence {opts.confidence}: a fraction between 0 and 1, e.g. 0.95")
    if opts.margin < 0:
        problems.append(f"--margin {opts.margin}: must be 0 or more (a fraction of the base's mean)")
    return problems


def ema_problem(source: Source) -> Optional[str]:
    """Why ``--ema`` cannot use ``source``: a LoRA folder (one set of weights), or a checkpoint without exactly one
    ``flowrl.callbacks.EMA`` state (:func:`flowrl.checkpoints.loading.ema_problem`: the weights are not read)."""
    from flowrl.checkpoints.loading import ema_problem as checkpoint_problem

    where = f"--ema: {source.name}={source.path}"
    if source.kind == "lora":
        return (f"{where} is a LoRA folder, one set of weights; export the run with `python -m flowrl export --ema` "
                "and pass that folder, or leave --ema out")
    return f"{where}: {why}" if (why := checkpoint_problem(source.path)) else None


def plan(opts: argparse.Namespace) -> tuple[Optional[Plan], list[str]]:
    """The evaluation of ``opts`` and every problem with it, found without loading weights."""
    problems = option_problems(opts)
    sources, wrong = read_sources(opts.ckpt_path, Path(opts.config).expanduser() if opts.config else None)
    problems += wrong
    if opts.ema:
        problems += [why for source in sources if (why := ema_problem(source))]
    base, base_path = None, opts.config
    if opts.config:
        try:
            base = read_config(Path(opts.config).expanduser())
        except Exception as err:  # missing file, bad YAML, an interpolation to nothing
            problems.append(f"--config {opts.config} cannot be read: {err}")
    elif sources and sources[0].config is not None:
        base, base_path = sources[0].config, sources[0].config_path
    elif not problems:
        problems.append("give --config (a fit config: the base model and its rewards) or --ckpt_path NAME=CKPT (a fit "
                        "checkpoint, whose run config is read)")
    if base is not None and not policy_spec(base):
        problems.append(f"--config {base_path} has no model.init_args.policy; give a fit config")
        base = None
    if base is None:
        return None, problems
    problems += base_problems(base, base_path, sources)
    base_lora, wrong = base_lora_folder(opts.base_lora)
    problems += wrong
    data = with_defaults(PromptDataModule, base.get("data"))  # every option, the declared default where unset
    suite_sources = opts.suite or ([data["val_prompts"]] if isinstance(data.get("val_prompts"), str) else None)
    if suite_sources is None:
        problems.append(f"give --suite (a named suite such as digits_val, or .txt/.jsonl files): {base_path} names no "
                        "data.val_prompts file")
        suite = None
    else:
        suite, wrong = load_suite(suite_sources)
        problems += wrong
    metrics, wrong = gather_metrics(base, base_path, sources, opts.held_out)
    problems += wrong + feature_problems(opts.features, metrics.rewards)
    if problems:
        return None, problems
    method = method_options(base)
    num_steps = opts.num_steps or method["eval_num_steps"] or method["num_steps"]  # the run's validation steps
    guidance = opts.guidance_scale if opts.guidance_scale is not None else method["guidance_scale"]
    batch_size = opts.batch_size or data["val_batch_size"]
    prompts_per_batch = max(1, batch_size // len(opts.seeds))
    if wrong := process_problem(opts, len(suite), prompts_per_batch):
        return None, [wrong]
    return Plan(base, base_path, base_lora, sources, suite, metrics, int(num_steps), float(guidance),
                prompts_per_batch), []


def process_problem(opts: argparse.Namespace, num_prompts: int, prompts_per_batch: int) -> Optional[str]:
    """Why the processes of ``--devices`` x ``--num_nodes`` cannot all draw a batch (each takes whole batches), or
    None (also where the count is known only once Lightning picks devices: ``auto``, ``-1``).

    >>> from flowrl.cli.evaluate import parser
    >>> process_problem(parser().parse_args(["--devices", "2", "--seeds", "0", "1", "--batch_size", "32"]), 16, 16)
    ... # doctest: +NORMALIZE_WHITESPACE
    '--devices 2: 16 prompts in batches of 16 (--batch_size 32 over 2 seeds) make 1 batch, so 1 of the 2 processes
     would draw nothing; use --devices 1, or --batch_size 16 or less'
    """
    devices = opts.devices.strip()
    count = (len([d for d in devices.split(",") if d.strip()]) if "," in devices else
             int(devices) if devices.isdigit() else None)
    if count is None:
        return None
    processes, batches = count * opts.num_nodes, -(-num_prompts // prompts_per_batch)
    if batches >= processes:
        return None
    seeds = len(opts.seeds)
    smaller = (f", or --batch_size {num_prompts // processes * seeds} or less" if num_prompts >= processes else
               f" (the suite has {num_prompts} prompts)")
    return (f"--devices {opts.devices}{f' --num_nodes {opts.num_nodes}' if opts.num_nodes > 1 else ''}: "
            f"{num_prompts} prompts in batches of {prompts_per_batch} (--batch_size {prompts_per_batch * seeds} over "
            f"{seeds} seeds) make {batches} batch{'es' * (batches > 1)}, so {processes - batches} of the {processes} "
            f"processes would draw nothing; use --devices {batches}{smaller}")


def method_options(config: dict) -> dict[str, Any]:
    """Every option of the method a fit config names, the method's declared default where the config sets none (a
    TDM-R1 config without ``guidance_scale`` samples without CFG, as its run did)."""
    from flowrl.methods import BaseModule

    model = as_dict(config.get("model"))
    return with_defaults(class_at(model.get("class_path")) or BaseModule, model.get("init_args"))


def base_lora_folder(value: Optional[str]) -> tuple[Optional[Path], list[str]]:
    """``--base_lora`` as a folder holding LoRA weights (an embedded name resolved), or the problem."""
    from flowrl.evaluation.sources import WEIGHTS_NAME
    from flowrl.model_paths import resolve_model

    if value is None:
        return None, []
    try:
        folder = Path(resolve_model(value))
    except FileNotFoundError as err:
        return None, [f"--base_lora {value}: {err}"]
    if not (folder / WEIGHTS_NAME).is_file():
        return None, [f"--base_lora {value}: no {WEIGHTS_NAME} there; give a LoRA folder (python -m flowrl export "
                      "--out FOLDER) or an embedded one such as flowrl/tiny-digits-k4"]
    return folder, []
