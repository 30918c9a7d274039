"""Reward curves from CSVLogger ``metrics.csv`` files, as one PNG.

    python scripts/plot_rewards.py runs/quickstart/csv/metrics.csv --out docs/quickstart_reward.png
    python scripts/plot_rewards.py flow=a/metrics.csv dense=b/metrics.csv --x nfe --out compare.png

Each run draws its per-step training reward (thin), a moving average (thick) and its validation points (markers).
``--x nfe`` puts the cumulative model evaluations per trajectory on the x axis (``rollout/nfe`` summed over steps;
proportional to total compute when the runs share a batch size).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Rows of a CSVLogger file with empty cells dropped and values as floats."""
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def series(rows: list[dict[str, float]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """``(xs, ys)`` of every row holding ``key``; ``x="nfe"`` uses the running sum of ``rollout/nfe``."""
    xs, ys, nfe = [], [], 0.0
    for row in rows:
        nfe += row.get("rollout/nfe", 0.0)
        if key in row:
            xs.append(nfe if x == "nfe" else row["step"])
            ys.append(row[key])
    return xs, ys


def moving_average(ys: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values.

    >>> moving_average([1.0, 2.0, 3.0, 4.0], 2)
    [1.0, 1.5, 2.5, 3.5]
    """
    return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


def plot(runs: dict[str, Path], out: Path, key: str = "reward/total", x: str = "step", window: int = 10) -> None:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for i, (label, path) in enumerate(runs.items()):
        rows, color = read_metrics(path), f"C{i}"
        tx, ty = series(rows, f"train/{key}", x)
        if not tx:
            raise SystemExit(f"{path} has no 'train/{key}' column; is it a flowrl CSVLogger metrics.csv?")
        ax.plot(tx, ty, color=color, alpha=0.25, lw=1)
        ax.plot(tx, moving_average(ty, window), color=color, lw=2, label=f"{label} train (mean of {window})")
        vx, vy = series(rows, f"val/{key}", x)
        if vx:
            ax.plot(vx, vy, "o--", color=color, ms=6, label=f"{label} validation")
    # rollout/nfe is per trajectory: with equal batch sizes its running sum is proportional to the total compute
    ax.set_xlabel("model evaluations per trajectory, cumulative (NFE)" if x == "nfe" else "optimizer step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="metrics.csv paths, optionally as label=path")
    parser.add_argument("--out", type=Path, default=Path("reward_curve.png"))
    parser.add_argument("--key", default="reward/total", help="metric after the train/ and val/ prefixes")
    parser.add_argument("--x", choices=["step", "nfe"], default="step")
    parser.add_argument("--window", type=int, default=10)
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.runs:
        label, _, path = spec.rpartition("=")
        runs[label or Path(path).parent.parent.name] = Path(path)
    missing = [str(p) for p in runs.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"no such metrics file: {missing}; CSVLogger writes <save_dir>/<name>/<version>/metrics.csv")
    plot(runs, args.out, args.key, args.x, args.window)


if __name__ == "__main__":
    main()
