"""``python -m flowrl evaluate``: the base model against tuned checkpoints on a prompt suite, paired by (prompt,
seed), with every metric, the reward-hacking signals and a report folder:

    python -m flowrl evaluate --ckpt_path tuned=runs/quickstart/version_0/checkpoints/last.ckpt --suite digits_val

Everything the command reads is checked before any weight loads (checkpoints, their run configs and base models,
the suite, the metrics), and every problem is reported at once with its fix. Generation runs in ``trainer.predict``
(:class:`~flowrl.evaluation.module.Evaluator`), so ``--devices 2`` splits it over two processes; rank zero writes the
report (:mod:`flowrl.evaluation.report`). The checks are :mod:`flowrl.cli.evaluate_plan`, the run
:mod:`flowrl.cli.evaluate_run`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Optional

import flowrl.cli.warning_filters  # noqa: F401  first: its filters must be in place before diffusers is imported
from flowrl.cli.evaluate_plan import (Plan, base_lora_folder, method_options, option_problems,  # noqa: F401
                                      plan, process_problem)
from flowrl.cli.evaluate_run import output_folder, run, trainer, write  # noqa: F401  re-exported: the moved parts

EPILOG = ("Models: NAME=PATH with PATH a fit checkpoint (its run's config.yaml is read from the run folder), a "
          "sharded checkpoint's folder, or a LoRA folder (pytorch_lora_weights.safetensors). The base model (the "
          "config's policy without trained weights) is always evaluated. See docs/evaluating.md.")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flowrl evaluate", allow_abbrev=False, epilog=EPILOG,
                                description=__doc__.split("::")[0].replace("``", ""))
    p.add_argument("--ckpt_path", nargs="+", default=[], metavar="NAME=PATH", help="tuned models, each named")
    p.add_argument("--ema", action="store_true", help="each checkpoint's flowrl.callbacks.EMA average instead of its "
                   "trained weights")
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


