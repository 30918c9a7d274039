"""The kept runs of docs/data/ reduced to what docs/results.md quotes, and the formats its tables use
(``scripts/results_tables.py`` builds the tables from them)."""

from __future__ import annotations

import csv
import functools
import statistics
from dataclasses import dataclass
from pathlib import Path

import plot_rewards as pr

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
CEILING = 0.98  # the digit classifier on real held-out canvases (getting-started.md): the top of the headroom
TRAIN, VAL = "train/reward/total", "val/reward/total"


@dataclass
class Seed:
    """One kept run (one seed)."""

    seed: int
    points: list[tuple[float, float]]  # validations: (model evaluations spent before it, held-out reward)
    before: float  # held-out reward before the first batch
    train: list[float]  # training reward per batch
    batch_evals: list[float]  # rollout/evaluations per batch (empty: not logged)
    nfe: float  # model evaluations per trajectory, summed over the run
    per_transition: list[float]  # rollout/nfe_per_trained_step per batch (empty: not logged)

    @property
    def total(self) -> float:
        return sum(self.batch_evals)

    @property
    def after(self) -> float:
        return self.points[-1][1]

    def half(self) -> tuple[float, float]:
        return pr.by_half([(0.0, self.before)] + self.points, self.total)

    def at(self, point) -> tuple[float, float]:
        """The validation at ``"before"``, ``"half"`` (the last by half), ``"after_half"`` (the first after it),
        ``"end"``, or the ``n``-th (0: before training)."""
        if point == "before":
            return 0.0, self.before
        if point == "half":
            return self.half()
        if point == "after_half":
            return next(p for p in self.points if p[0] > self.total / 2)
        return self.points[-1] if point == "end" else self.points[point]


def load(path: Path, seed: int) -> Seed:
    """A kept ``metrics.csv``. A run that logged no validation before its first batch takes its base model's from
    ``base_seed<k>.csv`` beside it (``python -m flowrl validate`` of the base under that seed)."""
    rows = pr.read_metrics(path)
    xs, ys = pr.series(rows, VAL, "evaluations")
    # the end's validation is logged twice (the last interval's and the final one): count it once
    points = [p for i, p in enumerate(zip(xs, ys)) if i == 0 or p != (xs[i - 1], ys[i - 1])]
    first_val = next(i for i, r in enumerate(rows) if VAL in r)
    if first_val < next(i for i, r in enumerate(rows) if TRAIN in r):
        before = points[0][1]
    else:
        base = Path(path).parent / f"base_seed{seed}.csv"
        if not base.is_file():
            raise SystemExit(f"{path} logged no validation before its first batch, and there is no {base}")
        before = pr.series(pr.read_metrics(base), VAL)[1][0]
    return Seed(seed=seed, points=points, before=before, train=pr.series(rows, TRAIN)[1],
                batch_evals=[r["rollout/evaluations"] for r in rows if "rollout/evaluations" in r],
                nfe=sum(r.get("rollout/nfe", 0.0) for r in rows),
                per_transition=[r["rollout/nfe_per_trained_step"] for r in rows if "rollout/nfe_per_trained_step" in r])


Run = list[Seed]


@functools.cache
def run(folder: str, stem: str, seeds: tuple[int, ...] = (0, 1, 2)) -> Run:
    """The seeds ``docs/data/<folder>/<stem>_seed<k>.csv``."""
    return [load(DATA / folder / f"{stem}_seed{s}.csv", s) for s in seeds]


@functools.cache
def _recorded() -> dict[tuple[str, str], str]:
    with open(DATA / "recorded.csv", newline="") as f:
        return {(r["quantity"], r["run"]): r["value"] for r in csv.DictReader(f)}


def recorded(quantity: str, key: str) -> str | None:
    """A figure the kept metrics cannot give, from ``docs/data/recorded.csv`` (which says where each came from)."""
    return _recorded().get((quantity, key))


def eighths(s: Seed) -> tuple[float, float]:
    """Training reward over the first and the last eighth of the batches (as ``plot_rewards.summary``)."""
    n = max(1, len(s.train) // 8)
    return statistics.fmean(s.train[:n]), statistics.fmean(s.train[-n:])


def share(before: float, after: float) -> str:
    """The share of the headroom from ``before`` to :data:`CEILING` that a run gained.

    >>> share(0.5, 0.74)
    '50%'
    """
    return f"{100 * (after - before) / (CEILING - before):.0f}%"


def signed(values: list[float]) -> str:
    """A gain: ``mean +- std`` with its sign.

    >>> signed([0.01, 0.03]), signed([-0.02])
    ('+0.020 +- 0.014', '-0.020')
    """
    text = pr.mean_std(values)
    return text if text.startswith("-") else "+" + text


def numeric(cell: str) -> bool:
    return cell[:1] in tuple("+-0123456789")


def md(header: list[str], rows: list[list[str]], bold: tuple[int, ...] = ()) -> str:
    """A Markdown table; in the ``bold`` columns the cells with the highest mean are bold.

    >>> print(md(["a", "b"], [["x", "0.5 +- 0.1"], ["y", "0.7"]], bold=(1,)))
    | a | b |
    | --- | --- |
    | x | 0.5 +- 0.1 |
    | y | **0.7** |
    """
    for col in bold:
        means = [float(r[col].split()[0]) if numeric(r[col]) else float("-inf") for r in rows]
        for r, m in zip(rows, means):
            r[col] = f"**{r[col]}**" if m == max(means) else r[col]
    return "\n".join("| " + " | ".join(r) + " |" for r in [header, ["---"] * len(header), *rows])
