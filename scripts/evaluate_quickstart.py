"""The quickstart's checkpoint against the base model, on the 128 held-out prompts x 4 seeds, with the report kept in
``docs/data/evaluate/`` and its chart and grid in ``docs/`` (the numbers of ``docs/evaluating.md``):

    python scripts/evaluate_quickstart.py                      # trains the quickstart first (10-20 min on a CPU)
    python scripts/evaluate_quickstart.py --ckpt runs/quickstart/latest/checkpoints/last.ckpt
    python scripts/evaluate_quickstart.py --rerender    # the kept report redrawn, no checkpoint needed

Rerun it when the quickstart changes. The evaluation itself is one command, printed before it runs. When only the
report's drawing changes, ``--rerender`` writes the kept report again from the kept ``scores.csv`` and
``diversity.csv``, with the grid's images read back from the kept ``grid.png`` (the 16 px canvases enlarged 7 times
without blur, so exactly), checks that the data files and ``report.md`` come out byte for byte as kept, and replaces
the pictures and ``report.html``; it prints the command's closing lines.
"""

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

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


def grid_images(grid: Path, prompts: list[int], seeds: list[int], models: list[str], cell: int = 112,
                label_width: int = 150, size: int = 16) -> dict:
    """The images of a report's ``grid.png`` (``flowrl.evaluation.figures.paired_grid``'s layout, any caption height),
    ``{(model, prompt, seed): [size, size, 3] uint8}``, each the centre pixel of its ``cell / size`` square; a square
    that is not one colour (an image enlarged with blur) is an error."""
    pixels = np.asarray(Image.open(grid).convert("RGB"))
    scale, header = cell // size, 36
    row_height = (pixels.shape[0] - header) // len(prompts)
    group = len(models) * (cell + 6) + 18
    images = {}
    for i, p in enumerate(prompts):
        for g, seed in enumerate(seeds):
            for j, model in enumerate(models):
                x, y = label_width + g * group + j * (cell + 6), header + i * row_height
                square = pixels[y:y + cell, x:x + cell].reshape(size, scale, size, scale, 3)
                if not (square == square[:, :1, :, :1]).all():
                    raise SystemExit(f"{grid}: the image of {model}, prompt {p}, seed {seed} is not a {size} px one "
                                     f"enlarged {scale} times without blur; rerun the evaluation instead")
                images[model, p, seed] = np.ascontiguousarray(square[:, scale // 2, :, scale // 2])
    return images


def rerender(kept: Path) -> None:
    """The kept report written again from its data (see the module's docstring)."""
    from flowrl.evaluation.report import Settings, verdicts, write_report
    from flowrl.evaluation.results import Table, analyse
    from flowrl.evaluation.suites import grid_prompts, load_suite

    settings = json.loads((kept / "evaluation.json").read_text())
    trained = settings.pop("trained")
    settings = Settings(**settings)
    suite, problems = load_suite([settings.suite])
    if problems:
        raise SystemExit("\n".join(problems))
    with open(kept / "scores.csv", newline="") as f:
        scores = [(r["model"], int(r["prompt_index"]), int(r["seed"]), r["metric"], float(r["value"] or "nan"))
                  for r in csv.DictReader(f)]
    with open(kept / "diversity.csv", newline="") as f:
        diversity = [(r["model"], int(r["prompt_index"]), r["space"], float(r["diversity"] or "nan"))
                     for r in csv.DictReader(f)]
    models = list(settings.models)
    names = [m for m in dict.fromkeys(r[3] for r in scores) if not m.startswith("drift_")]
    metrics = SimpleNamespace(names=names, trained=trained,  # the report reads the names and kinds alone
                              kind=lambda metric, model: "-" if model == "base" else
                              "trained" if metric in trained.get(model, []) else "held-out")
    table = Table.from_rows(models, len(suite), settings.seeds, scores, diversity)
    analysis = analyse(table, metrics, suite.categories, settings.resamples, settings.confidence,
                       settings.bootstrap_seed, settings.margin)
    grid = (grid_prompts(suite.categories, 8), settings.seeds[:2])  # the command's defaults, as the run used
    images = grid_images(kept / "grid.png", *grid, models)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        write_report(out, settings, suite, metrics, table, analysis, images, grid)
        differ = [n for n in ("scores.csv", "diversity.csv", "summary.csv", "report.md", "evaluation.json")
                  if (out / n).read_bytes() != (kept / n).read_bytes()]
        if differ:
            raise SystemExit(f"re-rendered from the kept data, {differ} differ from the kept files: rerun instead")
        for name in ("grid.png", "chart.png", "report.html"):
            shutil.copy(out / name, kept / name)
    shutil.copy(kept / "chart.png", ROOT / "docs/evaluate_chart.png")
    shutil.copy(kept / "grid.png", ROOT / "docs/evaluate_grid.png")
    print("\n".join(f"  {line}" for line in verdicts(analysis, metrics)).replace("**", ""))
    print(f"re-rendered: {kept}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", help="a quickstart checkpoint (default: train one, then use it)")
    parser.add_argument("--out", default=str(ROOT / "docs/data/evaluate"), help="where the small files are kept")
    parser.add_argument("--rerender", action="store_true", help="redraw the kept report from its data (no run)")
    opts = parser.parse_args()
    if opts.rerender:
        return rerender(Path(opts.out))
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
