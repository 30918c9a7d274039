"""How ``python -m flowrl evaluate`` runs a checked :class:`~flowrl.cli.evaluate_plan.Plan`: its report folder,
the models loaded, generation and scoring in ``trainer.predict`` on every rank, and (rank zero) the report."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Optional

from flowrl.cli.evaluate_plan import Plan
from flowrl.evaluation.features import feature_reward
from flowrl.evaluation.report import Settings
from flowrl.evaluation.sources import Source, policy_spec
from flowrl.evaluation.suites import grid_prompts


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
        models = load_models(policy_spec(found.base), found.sources, found.base_lora, opts.ema)
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
        # during a rank's last batch: decided on every rank, before the gathering
        if evaluator.ranks.sigterm_anywhere():
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
