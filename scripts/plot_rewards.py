"""Reward curves from CSVLogger ``metrics.csv`` files, as one PNG.

    python scripts/plot_rewards.py runs/quickstart/version_0/metrics.csv --out docs/quickstart_reward.png
    python scripts/plot_rewards.py flow=a/metrics.csv dense=b/metrics.csv --x nfe --out compare.png
    python scripts/plot_rewards.py flow=s0.csv,s1.csv,s2.csv dense=d0.csv,d1.csv,d2.csv --x nfe --table

A run resumed from a checkpoint logs into a new ``version_N`` folder; its curve starts with the history of the run it
resumed from (the ``ckpt_path`` of its ``config.yaml``). Each run draws its per-step training reward (thin), a moving
average (thick) and its validation points (markers). A run given as several comma-separated files (seeds of one
config) draws the mean over them of the moving average with a band from their min to their max, and the mean of their
validation points with min-max error bars. ``--x evaluations`` puts the cumulative model evaluations of the whole run
on the x axis (``rollout/evaluations``: what methods with different batch shapes are compared at). ``--x nfe`` puts
the cumulative model evaluations per trajectory on the x axis (``rollout/nfe`` summed over steps; proportional to
total compute when the runs share a batch size). ``--x minutes`` puts wall-clock minutes on the x axis, from the
TensorBoard events file the run wrote beside its ``metrics.csv``: minutes since the run's first logged value; the
seeds of one run are drawn at their mean minute per step. Runs compared this way must have had the same machine to
themselves. ``--table`` prints a Markdown table per run: training reward over the first and last eighth of the steps,
validation before training and after, NFE, as mean +- std over the files. ``--results``: docs/results.md's tables.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Rows of a CSVLogger file with empty cells dropped and values as floats, preceded by the history of the run
    it resumed from (see :func:`resumed_from`): that run's rows before this one's first step."""
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    earlier = resumed_from(Path(path))
    if earlier is None or not rows:
        return rows
    first = min(row["step"] for row in rows if "step" in row)
    return [row for row in read_metrics(earlier) if row.get("step", first) < first] + rows


def attach_minutes(rows: list[dict[str, float]], metrics: Path) -> list[dict[str, float]]:
    """``rows`` with ``minutes`` set on those the TensorBoard events file beside ``metrics`` holds: the wall time the
    row's first metric was logged at, in minutes since the file's first value. Rows it lacks (a resumed run's history,
    or no events file) get none."""
    events = sorted(metrics.parent.glob("events.out.tfevents.*"))
    if not events:
        return rows
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # slow import, rarely used

    logged: dict[tuple[str, int], float] = {}
    for path in events:
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            logged.update({(tag, e.step): e.wall_time for e in accumulator.Scalars(tag)})
    start = min(logged.values(), default=0.0)
    for row in rows:
        tags = [k for k in row if k not in ("epoch", "step") and (k, int(row.get("step", -1))) in logged]
        if tags:
            row["minutes"] = (logged[(tags[0], int(row["step"]))] - start) / 60
    return rows


def resumed_from(metrics: Path) -> Path | None:
    """The ``metrics.csv`` of the run a flowrl run resumed from: its ``config.yaml`` (saved by LightningCLI beside
    the metrics) names the checkpoint, and the checkpoint lies in ``<that run's folder>/checkpoints/``."""
    config = metrics.parent / "config.yaml"
    if not config.is_file():
        return None
    match = re.search(r"^ckpt_path: (.+)$", config.read_text(), flags=re.M)
    if not match or match.group(1).strip() in ("null", "last", "best", "hpc"):
        return None
    ckpt = Path(match.group(1).strip().strip("'\"")).expanduser()
    folder = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    earlier = folder / "metrics.csv"
    return earlier if earlier.is_file() and earlier.resolve() != metrics.resolve() else None


#: the running sum an x axis of model evaluations adds up: per trajectory, or the batch's over every rank
X_COUNTERS = {"nfe": "rollout/nfe", "evaluations": "rollout/evaluations"}


def series(rows: list[dict[str, float]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """``(xs, ys)`` of every row holding ``key``; ``x="nfe"`` uses the running sum of ``rollout/nfe`` (per
    trajectory), ``x="evaluations"`` that of ``rollout/evaluations`` (the whole batch's: comparable across methods
    whose batches hold different numbers of rows, e.g. tree leaves).

    >>> series([{"step": 0, "rollout/evaluations": 10.0, "r": 1.0}, {"step": 1, "rollout/evaluations": 30.0,
    ...          "r": 2.0}], "r", "evaluations")
    ([10.0, 40.0], [1.0, 2.0])
    """
    xs, ys, total = [], [], 0.0
    for row in rows:
        total += row.get(X_COUNTERS.get(x, ""), 0.0)
        if key in row and (x != "minutes" or "minutes" in row):
            xs.append(total if x in X_COUNTERS else row["minutes"] if x == "minutes" else row["step"])
            ys.append(row[key])
    return xs, ys


def moving_average(ys: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values.

    >>> moving_average([1.0, 2.0, 3.0, 4.0], 2)
    [1.0, 1.5, 2.5, 3.5]
    """
    return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


def seed_band(curves: list[tuple[list[float], list[float]]], mean_x: bool = False) -> tuple[
        list[float], list[float], list[float], list[float]]:
    """``(xs, mean, low, high)`` over curves that share their x values (seeds of one config), cut to the shortest;
    ``mean_x``: curves whose x values differ (wall time) are drawn at the mean x of each point.

    >>> seed_band([([0, 1, 2], [1.0, 2.0, 3.0]), ([0, 1], [3.0, 4.0])])
    ([0, 1], [2.0, 3.0], [1.0, 2.0], [3.0, 4.0])
    >>> seed_band([([0.0, 1.0], [1.0, 2.0]), ([0.0, 3.0], [3.0, 4.0])], mean_x=True)[0]
    [0.0, 2.0]
    """
    n = min(len(xs) for xs, _ in curves)
    xs = [statistics.fmean(c[0][i] for c in curves) for i in range(n)] if mean_x else curves[0][0][:n]
    if not mean_x and any(c[0][:n] != xs for c in curves):
        raise SystemExit("the files of one run have different steps or NFE; give seeds of one config per label")
    columns = list(zip(*(ys[:n] for _, ys in curves)))
    return xs, [statistics.fmean(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def mean_std(values: list[float]) -> str:
    """``mean +- std`` (sample std; the mean alone for one value).

    >>> mean_std([0.5, 0.7]), mean_std([0.25])
    ('0.600 +- 0.141', '0.250')
    """
    if len(values) == 1 or any(v != v for v in values):  # one value, or a NaN (nothing logged): no spread
        return f"{statistics.fmean(values):.3f}"
    return f"{statistics.fmean(values):.3f} +- {statistics.stdev(values):.3f}"


HALF_RULE = ("the held-out reward at the last validation at or before half of the run's own model evaluations "
             "(`rollout/evaluations` summed over the run), minus the same seed's held-out reward before training; a "
             "validation even one batch past half does not count")


def by_half(points: list[tuple[float, float]], total: float) -> tuple[float, float] | None:
    """The ``(evaluations, reward)`` that :data:`HALF_RULE`, the one definition (docs/results.md, ``--help``), reads.

    >>> by_half([(0, 0.4), (8064, 0.5), (16128, 0.6), (32004, 0.7)], 32004)
    (8064, 0.5)
    """
    return ([p for p in points if p[0] <= total / 2] or [None])[-1]


def summary(paths: list[Path], key: str = "reward/total") -> dict[str, list[float]]:
    """Per file: training reward over the first and last eighth of its steps, validation before training and last,
    NFE, and the validation gain by half the run's model evaluations (:data:`HALF_RULE`)."""
    out: dict[str, list[float]] = {"train_first": [], "train_last": [], "val_first": [], "val_last": [],
                                   "val_gain": [], "val_half_gain": [], "nfe": [], "evaluations": [], "minutes": []}
    for path in paths:
        rows = attach_minutes(read_metrics(path), Path(path))
        _, ty = series(rows, f"train/{key}")
        eighth = max(1, len(ty) // 8)
        out["train_first"].append(statistics.fmean(ty[:eighth]))
        out["train_last"].append(statistics.fmean(ty[-eighth:]))
        _, vy = series(rows, f"val/{key}")
        # the base to pair with is a validation logged before any training; a later first one is no base (NaN)
        first = next((row for row in rows if f"val/{key}" in row or f"train/{key}" in row), {})
        base = vy[0] if f"val/{key}" in first else float("nan")
        out["val_first"].append(base)
        out["val_last"].append(vy[-1] if vy else float("nan"))
        out["val_gain"].append(vy[-1] - base if vy else float("nan"))  # paired: the seed's own base
        out["nfe"].append(sum(row.get("rollout/nfe", 0.0) for row in rows))
        out["evaluations"].append(sum(row.get("rollout/evaluations", 0.0) for row in rows))
        vx, _ = series(rows, f"val/{key}", "evaluations")
        half = by_half(list(zip(vx, vy)), out["evaluations"][-1])
        out["val_half_gain"].append(half[1] - base if half else float("nan"))
        out["minutes"].append(max((row["minutes"] for row in rows if "minutes" in row), default=float("nan")))
    return out


def table(runs: dict[str, list[Path]], key: str = "reward/total") -> str:
    """A Markdown row per run; where the files log model evaluations, columns of the validation gain by half of
    them (what a method that needs half the compute would have to match) and of their total; where a TensorBoard
    events file lies beside them, the wall-clock minutes of the run."""
    summaries = {label: summary(paths, key) for label, paths in runs.items()}
    evaluations = any(v for s in summaries.values() for v in s["evaluations"])
    minutes = any(v == v for s in summaries.values() for v in s["minutes"])  # NaN != NaN: no events file
    header = ["run", "files", "NFE per trajectory, run total", "training reward, first eighth", "last eighth",
              "validation before", "after", "gain (paired by seed)"]
    header += ["gain by half the evaluations", "model evaluations"] if evaluations else []
    header += ["wall minutes"] if minutes else []
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for label, s in summaries.items():
        cells = [label, str(len(runs[label])), f"{statistics.fmean(s['nfe']):.0f}"] + [
            mean_std(s[k]) for k in ("train_first", "train_last", "val_first", "val_last", "val_gain")]
        cells += [mean_std(s["val_half_gain"]), f"{statistics.fmean(s['evaluations']):.0f}"] if evaluations else []
        cells += [f"{statistics.fmean(s['minutes']):.1f}"] if minutes else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, list[Path]], out: Path, key: str = "reward/total", x: str = "step", window: int = 10,
         split: bool = False) -> None:
    """One axes with training curves and validation points; ``split``: training and validation side by side, the
    legend below (for many runs)."""
    if split:
        fig, (ax, vax) = plt.subplots(1, 2, figsize=(12, 5), dpi=110, sharex=True)
    else:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        vax = ax
    for i, (label, paths) in enumerate(runs.items()):
        color, trains, vals = f"C{i}", [], []
        for path in paths:
            rows = read_metrics(path)
            if x == "minutes":
                rows = attach_minutes(rows, Path(path))
                if not any("minutes" in row for row in rows):
                    raise SystemExit(f"no TensorBoard events file beside {path}: --x minutes reads the wall times "
                                     "the run's TensorBoardLogger wrote (flowrl's configs log to it)")
            tx, ty = series(rows, f"train/{key}", x)
            if not tx:
                raise SystemExit(f"{path} has no 'train/{key}' column; is it a flowrl CSVLogger metrics.csv?")
            trains.append((tx, ty))
            vx, vy = series(rows, f"val/{key}", x)
            # split: each seed's gain over its own base model, which removes the seed's validation-noise offset
            vals.append((vx, [v - vy[0] for v in vy] if split and vy else vy))
        seeds = f", mean of {len(paths)}" if len(paths) > 1 else ""
        if len(paths) == 1:
            ax.plot(*trains[0], color=color, alpha=0.25, lw=1)
        xs, mean, low, high = seed_band([(tx, moving_average(ty, window)) for tx, ty in trains], x == "minutes")
        if len(paths) > 1:
            ax.fill_between(xs, low, high, color=color, alpha=0.2 if not split else 0.1, lw=0)
        ax.plot(xs, mean, color=color, lw=2, label=f"{label} train (moving mean of {window}{seeds})" if not split
                else f"{label}{seeds.replace(', mean', ' (mean')}{')' if seeds else ''}")
        if all(vx for vx, _ in vals):
            vx, vmean, vlow, vhigh = seed_band(vals, x == "minutes")
            err = [[m - lo for m, lo in zip(vmean, vlow)], [hi - m for m, hi in zip(vmean, vhigh)]]
            vax.errorbar(vx, vmean, yerr=err if len(paths) > 1 else None, fmt="o--", color=color, ms=6, capsize=3,
                         label=None if split else f"{label} validation")
    # rollout/nfe is per trajectory: with equal batch sizes its running sum is proportional to the total compute
    xlabel = {"nfe": "model evaluations per trajectory, cumulative (NFE)",
              "evaluations": "model evaluations, cumulative (the whole batch's)",
              "minutes": "wall-clock minutes (mean over the seeds)"}.get(x, "training step (one sampled batch)")
    panels = [(ax, f"training {key} (moving mean)"), (vax, f"held-out validation {key}: gain over the base model")]
    for axes, what in panels if split else [(ax, key)]:
        axes.set_xlabel(xlabel)
        axes.set_ylabel(what)
        axes.grid(alpha=0.3)
    if split:
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=min(4, len(runs)), fontsize=8,
                   title="bands and error bars: min to max over the seeds", title_fontsize=8)
        fig.tight_layout(rect=(0, 0.08 + 0.035 * ((len(runs) - 1) // 4), 1, 1))
    else:
        ax.legend(fontsize=8)
        fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog=f"Gain by half (--table, --results): {HALF_RULE}.")
    parser.add_argument("runs", nargs="*", help="metrics.csv paths, optionally as label=path or label=path,path,...")
    parser.add_argument("--out", type=Path, default=Path("reward_curve.png"))
    parser.add_argument("--key", default="reward/total", help="metric after the train/ and val/ prefixes")
    parser.add_argument("--x", choices=["step", "nfe", "evaluations", "minutes"], default="step")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--table", action="store_true", help="also print a Markdown summary table")
    parser.add_argument("--split", action="store_true", help="training and validation in two panels, legend below")
    parser.add_argument("--results", action="store_true", help="print docs/results.md's tables from docs/data/")
    parser.add_argument("--write", action="store_true", help="with --results: paste them into docs/results.md")
    args = parser.parse_args(argv)
    if args.results:
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_tables sits beside this script
        return __import__("results_tables").main(write=args.write)
    if not args.runs:
        parser.error("give the runs' metrics.csv files (or --results)")
    runs = {}
    for spec in args.runs:
        label, _, paths = spec.rpartition("=")
        files = [Path(p) for p in paths.split(",")]
        runs[label or files[0].parent.parent.name] = files
    missing = [str(p) for files in runs.values() for p in files if not p.is_file()]
    if missing:
        raise SystemExit(f"no such metrics file: {missing}; CSVLogger writes <save_dir>/<name>/<version>/metrics.csv")
    plot(runs, args.out, args.key, args.x, args.window, args.split)
    if args.table:
        print(table(runs, args.key))


if __name__ == "__main__":
    main()
