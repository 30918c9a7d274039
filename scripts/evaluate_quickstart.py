"""The quickstart's checkpoint against the base model, on the 128 held-out prompts x 4 seeds, with the report kept in
``docs/data/evaluate/`` and its chart and grid in ``docs/`` (the numbers of ``docs/evaluating.md``):

    python scripts/evaluate_quickstart.py                      # trains the quickstart first (10-20 min on a CPU)
    python scripts/evaluate_quickstart.py --ckpt runs/quickstart/latest/checkpoints/last.ckpt

Rerun it when the quickstart changes. The evaluation itself is one command, printed before it runs.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = ["report.md", "report.html", "scores.csv", "diversity.csv", "summary.csv", "evaluation.json", "chart.png",
        "grid.png"]


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def newest_checkpoint() -> Path:
    found = sorted((ROOT / "runs/quickstart").glob("version_*/checkpoints/last.ckpt"),
                   key=lambda p: int(p.parts[-3].split("_")[1]))
    if not found:
        raise SystemExit("no runs/quickstart/version_N/checkpoints/last.ckpt; run without --ckpt to train one")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", help="a quickstart checkpoint (default: train one, then use it)")
    parser.add_argument("--out", default=str(ROOT / "docs/data/evaluate"), help="where the small files are kept")
    opts = parser.parse_args()
    if opts.ckpt is None:
        run([sys.executable, "-m", "flowrl", "fit", "--config", "configs/quickstart.yaml"])
    ckpt = Path(opts.ckpt).resolve() if opts.ckpt else newest_checkpoint()
    report = ckpt.parents[1] / "evaluations" / "quickstart"
    relative = lambda p: str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)  # noqa: E731  as typed
    run([sys.executable, "-m", "flowrl", "evaluate", "--ckpt_path", f"quickstart={relative(ckpt)}", "--suite",
         "digits_val", "--seeds", "0", "1", "2", "3", "--held_out", "configs/evaluate/digits_held_out.yaml", "--out",
         relative(report)])
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in KEPT:  # the images/ folder (1,024 PNGs) stays with the run
        shutil.copy(report / name, out / name)
    shutil.copy(report / "chart.png", ROOT / "docs/evaluate_chart.png")  # the site leaves docs/data/ out
    shutil.copy(report / "grid.png", ROOT / "docs/evaluate_grid.png")
    print(f"kept: {out}")


if __name__ == "__main__":
    main()
