"""Reward hacking, caught: the embedded model trained on a gameable reward (mean brightness), three of its checkpoints
evaluated against the base with digit alignment and colour match held out. Brightness rises at every checkpoint while
the digits go; ``evaluate`` flags each checkpoint. Keeps the report in ``docs/data/evaluate_hacking/`` and its chart
and grid in ``docs/`` (``docs/evaluating.md``)::

    PYTHONPATH=. python scripts/demo_reward_hacking.py      # about 2 minutes on 2 CPU cores

The fit is ``tests/evaluation/fit_brightness.yaml`` (the tests' 2-step run) run longer at a lower learning rate.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = ["report.md", "report.html", "summary.csv", "evaluation.json", "chart.png", "grid.png"]  # scores.csv: 0.8 MB


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps (a checkpoint every third of them)")
    parser.add_argument("--lr", default="1e-3", help="the learning rate (the tests' run: 1e-2)")
    parser.add_argument("--run", default="runs/hacking", help="the run's folder, from the repository (replaced)")
    parser.add_argument("--out", default=str(ROOT / "docs/data/evaluate_hacking"), help="where the small files go")
    opts = parser.parse_args()
    folder = Path(opts.run)  # relative paths start at the repository, where the commands run
    shutil.rmtree(ROOT / folder, ignore_errors=True)
    every = opts.steps // 3
    run([sys.executable, "-m", "flowrl", "fit", "--config", "tests/evaluation/fit_brightness.yaml",
         f"--trainer.max_steps={opts.steps}", f"--trainer.default_root_dir={folder}",
         f"--model.init_args.optimizer.init_args.lr={opts.lr}", "--trainer.callbacks+=ModelCheckpoint",
         f"--trainer.callbacks.every_n_train_steps={every}", "--trainer.callbacks.save_top_k=-1",
         "--trainer.callbacks.filename=step{step}", "--trainer.callbacks.auto_insert_metric_name=false"])
    checkpoints = [f"step{k}={folder / 'checkpoints' / f'step{k}.ckpt'}" for k in range(every, opts.steps + 1, every)]
    report = folder / "evaluation"
    run([sys.executable, "-m", "flowrl", "evaluate", "--ckpt_path", *checkpoints, "--suite", "digits_val",
         "--num_steps", "10", "--held_out", "flowrl.rewards.DigitAlignment", "configs/evaluate/digits_held_out.yaml",
         "--out", str(report), "--no_images", "--grid_prompts", "4"])
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        shutil.copy(ROOT / report / name, out / name)
    shutil.copy(ROOT / report / "chart.png", ROOT / "docs/evaluate_hacking_chart.png")
    shutil.copy(ROOT / report / "grid.png", ROOT / "docs/evaluate_hacking_grid.png")
    print(f"kept: {out}")


if __name__ == "__main__":
    main()
