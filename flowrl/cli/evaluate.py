"""``python -m flowrl evaluate``: the base model against tuned checkpoints on a prompt suite, paired by (prompt,
seed), with every metric, the reward-hacking signals and a report folder:

    python -m flowrl evaluate --ckpt_path tuned=runs/quickstart/version_0/checkpoints/last.ckpt --suite digits_val

Everything the command reads is checked before any weight loads (checkpoints, their run configs and base models,
the suite, the metrics), and every problem is reported at once with its fix. Generation runs in ``trainer.predict``
(:class:`~flowrl.evaluation.module.Evaluator`), so ``--devices 2`` splits it over two processes; rank zero writes the
report (:mod:`flowrl.evaluation.report`).
"""

from __future__ import annotations

import argparse
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import flowrl.cli.warning_filters  # noqa: F401  first: its filters must be in place before diffusers is imported
from flowrl.config_nodes import as_dict, class_at, with_defaults
from flowrl.data import PromptDataModule
from flowrl.evaluation.features import feature_problems, feature_reward
from flowrl.evaluation.metrics import Metrics, gather_metrics
from flowrl.evaluation.report import Settings
from flowrl.evaluation.sources import Source, base_problems, policy_spec, read_config, read_sources
from flowrl.evaluation.suites import Suite, grid_prompts, load_suite

EPILOG = ("Models: NAME=PATH with PATH a fit checkpoint (its run's config.yaml is read from the run folder), a "
          "sharded checkpoint's folder, or a LoRA folder (pytorch_lora_weights.safetensors). The base model (the "
          "config's policy without trained weights) is always evaluated. See docs/evaluating.md.")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flowrl evaluate", allow_abbrev=False, epilog=EPILOG,
                                description=__doc__.split("::")[0].replace("``", ""))
    p.add_argument("--ckpt_path", nargs="+", default=[], metavar="NAME=PATH", help="tuned models, each named")
    p.add_argument("--config", help="a fit config: the base model, the trained rewards, the defaults below (default: "
                   "the first checkpoint's run config)")
    p.add_argument("--base_lora", help="LoRA weights the base model carries: a folder, or an embedded flowrl/<name> "
                   "such as flowrl/tiny-digits-k4, the distilled generator TDM-R1 starts from (default: none)")
    p.add_argument("--suite", nargs="+", metavar="SUITE", help="a named suite (digits_val) or .txt/.jsonl prompt files "
                   "(default: the config's data.val_prompts)")
    p.add_argument("--held_out", nargs="+", default=[], metavar="FILE|CLASS",
                   help="held-out metrics: a YAML file of reward callbacks (as trainer.callbacks) or a class path")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3], help="seeds of every prompt (default 0 1 2 3)")
    p.add_argument("--num_steps", type=int, help="ODE steps (default: the config's model.init_args.eval_num_steps)")
    p.add_argument("--guidance_scale", type=float, help="classifier-free guidance (default: the config's)")
    p.add_argument("--batch_size", type=int, help="images per model call, in whole prompts (default: the config's "
                   "data.val_batch_size)")
    p.add_argument("--features", default="auto", help="the metric whose image features measure drift and "
                   "diversity: auto (the first that has them), none, or a metric's name")
    p.add_argument("--out", help="the report folder (default: <run>/evaluations/<n> of the first checkpoint)")
    p.add_argument("--no_images", action="store_true", help="do not write every image (the grid is still drawn)")
    p.add_argument("--grid_prompts", type=int, default=8, help="prompts in the report's grid (default 8)")
    p.add_argument("--grid_seeds", type=int, default=2, help="seeds of each grid prompt (default 2)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval coverage (default 0.95)")
    p.add_argument("--bootstrap_seed", type=int, default=0, help="seed of the bootstrap's resamples (default 0)")
    p.add_argument("--margin", type=float, default=0.0, help="how far, as a fraction of the base's mean, a held-out "
                   "reward or diversity must fall beyond its interval to raise the flag (default 0)")
    p.add_argument("--accelerator", default="auto", help="Lightning's accelerator (cpu, cuda, auto)")
    p.add_argument("--devices", default="1", help="Lightning's devices: a count (2) or auto (default 1)")
    p.add_argument("--num_nodes", type=int, default=1, help="machines (default 1)")
    p.add_argument("--strategy", default="auto", help="Lightning's strategy (default: ddp for several devices)")
    p.add_argument("--precision", default="32-true", help="Lightning's precision, e.g. bf16-mixed (default 32-true)")
    return p


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


def plan(opts: argparse.Namespace) -> tuple[Optional[Plan], list[str]]:
    """The evaluation of ``opts`` and every problem with it, found without loading weights."""
    problems = option_problems(opts)
    sources, wrong = read_sources(opts.ckpt_path, Path(opts.config).expanduser() if opts.config else None)
    problems += wrong
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


def output_folder(opts: argparse.Namespace, sources: list[Source]) -> Optional[Path]:
    """``--out``, or a new ``<run>/evaluations/<n>`` beside the first checkpoint's run (``./evaluations/<n>``
    without one); reserved on rank zero only (other ranks get rank zero's folder from the Evaluator)."""
    from flowrl.callbacks.image_writer import next_free_folder
    from flowrl.cli.log_versions import launched_as_rank_zero

    if not launched_as_rank_zero():
        return None
    if opts.out:
        return Path(opts.out).expanduser()
    first = next((s.path for s in sources), None)
    run = (first.parent.parent if first.parent.name == "checkpoints" else first.parent) if first else Path.cwd()
    return next_free_folder(run / "evaluations")


def main(args: list[str]) -> Optional[Path]:
    """Runs ``python -m flowrl evaluate ARGS``; returns the report folder on rank zero (None on other ranks)."""
    opts = parser().parse_args(args)
    found, problems = plan(opts)
    if problems:
        raise SystemExit("flowrl evaluate: invalid options:\n  " + "\n  ".join(problems))
    out = output_folder(opts, found.sources)
    if out is not None:
        from flowrl.output_dirs import unwritable

        if why := unwritable(str(out)):
            raise SystemExit(f"flowrl evaluate: invalid options:\n  --out {out} cannot be written ({why})")
    return run(opts, found, out, shlex.join(["python", "-m", "flowrl", "evaluate", *args]))


def trainer(opts: argparse.Namespace, callbacks: list):
    """Lightning's trainer for ``trainer.predict`` on the devices of ``opts`` (DDP for several)."""
    from lightning.pytorch import Trainer

    devices = int(opts.devices) if opts.devices.isdigit() else opts.devices
    several = devices not in (1, "auto") or opts.num_nodes > 1
    return Trainer(accelerator=opts.accelerator, devices=devices, num_nodes=opts.num_nodes,
                   strategy="ddp" if opts.strategy == "auto" and several else opts.strategy, precision=opts.precision,
                   logger=False, enable_checkpointing=False, enable_model_summary=False, use_distributed_sampler=False,
                   callbacks=callbacks)


def run(opts: argparse.Namespace, found: Plan, out: Optional[Path], command: str) -> Optional[Path]:
    """Loads the models, generates and scores on every rank, and (rank zero) writes the report."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from flowrl.evaluation.interrupt import INCOMPLETE, StopOnSigterm, mark_complete, mark_incomplete
    from flowrl.evaluation.models import ForeignLora, load_models
    from flowrl.evaluation.module import EvaluationProgressBar, Evaluator

    suite, metrics, seeds = found.suite, found.metrics, opts.seeds
    grid = (grid_prompts(suite.categories, opts.grid_prompts), seeds[:opts.grid_seeds])
    features = feature_reward(opts.features, metrics.rewards)
    names = ["base", *[s.name for s in found.sources]]
    if out is not None:
        print(f"flowrl evaluate: {' + '.join(names)} on {suite.name} ({len(suite)} prompts x {len(seeds)} seeds = "
              f"{len(suite) * len(seeds)} images per model), {found.num_steps} ODE steps, guidance "
              f"{found.guidance_scale:g} -> {out}", flush=True)
    if out is not None:  # before anything is redrawn: never an earlier report beside this run's images
        for path in mark_incomplete(out, command):
            print(f"flowrl evaluate: removed {path} (an earlier evaluation's; its images are redrawn now)", flush=True)
    try:
        models = load_models(policy_spec(found.base), found.sources, found.base_lora)
    except ForeignLora as err:  # one line naming both models, not peft's error
        raise SystemExit(f"flowrl evaluate: {err}") from None
    evaluator = Evaluator(models, suite, seeds, found.num_steps, found.guidance_scale, found.prompts_per_batch,
                          features.name if features else None,
                          None if opts.no_images or out is None else str(out / "images"),
                          frozenset((p, s) for p in grid[0] for s in grid[1]))
    bar = EvaluationProgressBar(f"evaluate: {len(models)} model{'s' * (len(models) > 1)}")
    stop = StopOnSigterm(out)
    runner = trainer(opts, [*metrics.rewards, bar, stop])
    try:
        runner.predict(evaluator, return_predictions=False)
        if evaluator.sigterm_anywhere():  # during a rank's last batch: decided on every rank, before the gathering
            raise SIGTERMException
    except SIGTERMException as stopped:  # Lightning's would exit 0: a scheduler would read success
        if out is not None:
            print(f"flowrl evaluate: stopped by SIGTERM; {out} has no report (its {INCOMPLETE} marker says so); run "
                  "the command again to evaluate", flush=True)
        raise SystemExit(128 + signal.SIGTERM) from stopped
    finally:
        stop.restore()
    scores, diversity, images = evaluator.gathered()
    if not runner.is_global_zero:
        return None
    base = f"{policy_spec(found.base).get('init_args', {}).get('model')} ({found.base_path})"
    settings = Settings({"base": base + (f" + LoRA {opts.base_lora}" if opts.base_lora else ""),
                         **{s.name: str(s.path) for s in found.sources}}, suite.name, seeds, found.num_steps,
                        found.guidance_scale, features.name if features else None, opts.resamples, opts.confidence,
                        opts.bootstrap_seed, opts.margin, command)
    write(out, settings, found, names, (scores, diversity, images), grid)
    mark_complete(out)
    return out


def write(out: Path, settings: Settings, found: Plan, names: list[str], gathered: tuple, grid: tuple) -> Path:
    """The statistics of the gathered rows, the report folder, and its summary on the console."""
    from flowrl.evaluation.report import verdicts, write_report
    from flowrl.evaluation.results import Table, analyse

    scores, diversity, images = gathered
    table = Table.from_rows(names, len(found.suite), settings.seeds, scores, diversity)
    analysis = analyse(table, found.metrics, found.suite.categories, settings.resamples, settings.confidence,
                       settings.bootstrap_seed, settings.margin)
    report = write_report(out, settings, found.suite, found.metrics, table, analysis, images, grid)
    print("\n".join([f"  report:  {report}", f"  html:    {out / 'report.html'}", f"  scores:  {out / 'scores.csv'}",
                     *[f"  {line}" for line in verdicts(analysis, found.metrics)]]).replace("**", ""), flush=True)
    return out
