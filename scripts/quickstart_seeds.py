"""The README's quickstart for seeds 0, 1 and 2, exactly as a user runs it, and the figures the docs quote from it.

    python scripts/quickstart_seeds.py                    # runs the 3 seeds (about 11 min each on 2 idle cores)
    python scripts/quickstart_seeds.py --keep docs/data/quickstart   # ... and keeps their metrics.csv there
    python scripts/quickstart_seeds.py --report docs/data/quickstart # only the figures, from kept files

Each seed is ``python -m flowrl fit --config configs/quickstart.yaml --seed_everything=S`` with nothing else changed
(torch's default thread count: the number of cores; a different thread count changes the float reductions and so
the last digits of a run). The report is the validation alignment before and after per seed, their mean and
sample std, and the share of the headroom to the classifier's ceiling: the numbers the README, Getting started
and Results quote, which ``tests/docs/test_quickstart_figures.py`` holds equal to the kept files. The wall time each
seed prints is not in its metrics: the one the docs quote is kept in ``docs/data/recorded.csv`` (``quickstart/seed2``).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
CEILING = 0.98  # the digit classifier's alignment on the canvases drawn from the prompts (docs/results.md)
KEPT = {0: "metrics.csv", 1: "metrics_seed1.csv", 2: "metrics_seed2.csv"}


def validation(path: Path) -> tuple[float, float]:
    """The validation alignment before the first step and after the last, as the run logged them."""
    with open(path, newline="") as f:
        values = [float(r["val/reward/digit_alignment"]) for r in csv.DictReader(f)
                  if r.get("val/reward/digit_alignment")]
    return values[0], values[-1]


def figures(files: dict[int, Path]) -> dict[str, str]:
    """The quoted figures, formatted as the docs print them.

    Keys: ``before`` / ``after`` (seed 0, 3 decimals), ``before4`` / ``after4`` (seed 0, 4 decimals, as the run
    summary prints), ``mean_after`` and ``std_after`` (seeds 0-2, sample std, n - 1), ``mean_before``, ``std_before``,
    ``headroom`` (seed 0) and ``mean_headroom``: ``(after - before) / (ceiling - before)`` in percent.
    """
    runs = {seed: validation(path) for seed, path in files.items()}
    before, after = runs[0]
    befores, afters = [b for b, _ in runs.values()], [a for _, a in runs.values()]
    mean_before, mean_after = statistics.fmean(befores), statistics.fmean(afters)
    return {"before": f"{before:.3f}", "after": f"{after:.3f}", "before4": f"{before:.4f}", "after4": f"{after:.4f}",
            "mean_before": f"{mean_before:.3f}", "std_before": f"{statistics.stdev(befores):.3f}",
            "mean_after": f"{mean_after:.3f}", "std_after": f"{statistics.stdev(afters):.3f}",
            "headroom": f"{100 * (after - before) / (CEILING - before):.0f}%",
            "mean_headroom": f"{100 * (mean_after - mean_before) / (CEILING - mean_before):.0f}%",
            **{f"after_seed{s}": f"{runs[s][1]:.3f}" for s in runs}}


def run(seed: int, out: Path) -> tuple[Path, float]:
    """One seed of the README's command; its metrics.csv and wall seconds."""
    root = out / f"seed{seed}"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flowrl", "fit", "--config", "configs/quickstart.yaml",
                    f"--seed_everything={seed}", f"--trainer.default_root_dir={root}"], cwd=ROOT, check=True)
    (metrics,) = sorted(root.glob("quickstart/version_*/metrics.csv"))[-1:]
    return metrics, time.perf_counter() - started


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "quickstart_seeds")
    parser.add_argument("--keep", type=Path, default=None, help="copy each seed's metrics.csv here (the docs' data)")
    parser.add_argument("--report", type=Path, default=None, help="no runs: the figures of the kept files here")
    args = parser.parse_args(argv)
    if args.report is not None:
        files = {seed: args.report / name for seed, name in KEPT.items()}
    else:
        files = {}
        for seed in SEEDS:
            files[seed], seconds = run(seed, args.out)
            print(f"seed {seed}: {seconds / 60:.1f} min, {files[seed]}", flush=True)
        if args.keep is not None:
            for seed, path in files.items():
                shutil.copyfile(path, args.keep / KEPT[seed])
    for key, value in figures(files).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
