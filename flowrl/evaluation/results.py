"""What an evaluation found: the gathered rows as ``[P, S]`` arrays, the statistics of every (metric, model) and
category, the hacking signals and flags, and the CSV files that hold them.

Rows come from :class:`~flowrl.evaluation.module.Evaluator` in any order (any number of ranks); everything here is
sorted by the suite's prompt order, the seeds' order, the models' and the metrics' order, so the files are a function
of the scores alone.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from flowrl.evaluation.metrics import Metrics
from flowrl.evaluation.signals import Flag, hacking_flag
from flowrl.evaluation.stats import Comparison, Summary, category_masks, compare, summarize
from flowrl.evaluation.suites import Suite

SPACES = ("pixels", "features")


@dataclass
class Table:
    """``scores[(metric, model)] [P, S]`` (rewards and drifts) and ``diversity[(space, model)] [P, 1]``; NaN where a
    cell was not scored."""

    models: list[str]
    seeds: list[int]
    scores: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    diversity: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    @staticmethod
    def from_rows(models: list[str], num_prompts: int, seeds: list[int], scores: list[tuple],
                  diversity: list[tuple]) -> "Table":
        """The table of ``scores`` rows ``(model, prompt, seed, metric, value)`` and ``diversity`` rows ``(model,
        prompt, space, value)``.

        >>> t = Table.from_rows(["base"], 2, [0, 5], [("base", 1, 5, "r", 0.5)], [("base", 0, "pixels", 0.1)])
        >>> t.scores["r", "base"].tolist(), t.diversity["pixels", "base"].tolist()
        ([[nan, nan], [nan, 0.5]], [[0.1], [nan]])
        """
        table, column = Table(list(models), list(seeds)), {s: j for j, s in enumerate(seeds)}
        for model, prompt, seed, metric, value in scores:
            cells = table.scores.setdefault((metric, model), np.full((num_prompts, len(seeds)), np.nan))
            cells[prompt, column[seed]] = value
        for model, prompt, space, value in diversity:
            cells = table.diversity.setdefault((space, model), np.full((num_prompts, 1), np.nan))
            cells[prompt, 0] = value
        return table

    def metrics(self) -> list[str]:
        return list(dict.fromkeys(metric for metric, _ in self.scores))


@dataclass
class Analysis:
    """Every statistic of one evaluation (``stats`` and ``signals`` applied to a :class:`Table`)."""

    means: dict[tuple[str, str], Summary] = field(default_factory=dict)  # (metric, model), every model
    comparisons: dict[tuple[str, str], Comparison] = field(default_factory=dict)  # (metric, tuned model)
    categories: dict[tuple[str, str, str], Comparison] = field(default_factory=dict)  # (category, metric, model)
    drift: dict[tuple[str, str], Summary] = field(default_factory=dict)  # (space, tuned model)
    diversity: dict[tuple[str, str], Comparison] = field(default_factory=dict)  # (space, tuned model)
    flags: dict[str, Flag] = field(default_factory=dict)


def analyse(table: Table, metrics: Metrics, categories: list[Optional[str]], resamples: int = 10_000,
            confidence: float = 0.95, seed: int = 0, margin: float = 0.0) -> Analysis:
    """The statistics of ``table`` (the base is ``table.models[0]``) and each tuned model's hacking flag."""
    base, tuned = table.models[0], table.models[1:]
    options = {"resamples": resamples, "confidence": confidence, "seed": seed}
    out = Analysis()
    masks = category_masks(categories)
    for metric in metrics.names:
        for model in table.models:
            out.means[metric, model] = summarize(table.scores[metric, model], **options)
        for model in tuned:
            out.comparisons[metric, model] = compare(table.scores[metric, model], table.scores[metric, base],
                                                     **options)
            for category, mask in masks.items():
                out.categories[category, metric, model] = compare(table.scores[metric, model],
                                                                  table.scores[metric, base], prompts=mask, **options)
    for space in SPACES:
        for model in tuned:
            if (f"drift_{space}", model) in table.scores:
                out.drift[space, model] = summarize(table.scores[f"drift_{space}", model], **options)
            if (space, model) in table.diversity and np.isfinite(table.diversity[space, model]).any():
                out.diversity[space, model] = compare(table.diversity[space, model], table.diversity[space, base],
                                                      **options)
    for model in tuned:
        trained = {m: out.comparisons[m, model] for m in metrics.names if metrics.kind(m, model) == "trained"}
        watched = {m: out.comparisons[m, model] for m in metrics.names if metrics.kind(m, model) == "held-out"}
        watched.update({f"diversity ({space})": c for (space, m), c in out.diversity.items() if m == model})
        out.flags[model] = hacking_flag(model, trained, watched, margin)
    return out


def number(value: float) -> str:
    """A value as CSV text that reads back to the same float (``repr``), empty for NaN.

    >>> number(0.1 + 0.2), number(float("nan"))
    ('0.30000000000000004', '')
    """
    return "" if math.isnan(value) else repr(float(value))


def write_scores(path: Path, table: Table, suite: Suite) -> None:
    """``scores.csv``: one line per (model, prompt, seed, metric), in model, prompt, seed and metric order."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["model", "prompt_index", "prompt", "category", "seed", "metric", "value"])
        for model in table.models:
            for p, prompt in enumerate(suite.prompts):
                for j, seed in enumerate(table.seeds):
                    for metric in table.metrics():
                        if (metric, model) in table.scores:
                            out.writerow([model, p, prompt, suite.categories[p] or "", seed, metric,
                                          number(table.scores[metric, model][p, j])])


def write_diversity(path: Path, table: Table, suite: Suite) -> None:
    """``diversity.csv``: one line per (model, prompt, space): the mean pairwise distance of the prompt's seeds."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["model", "prompt_index", "prompt", "category", "space", "diversity"])
        for model in table.models:
            for p, prompt in enumerate(suite.prompts):
                for space in SPACES:
                    if (space, model) in table.diversity:
                        out.writerow([model, p, prompt, suite.categories[p] or "", space,
                                      number(table.diversity[space, model][p, 0])])


SUMMARY_COLUMNS = ["section", "metric", "model", "category", "kind", "prompts", "mean", "mean_low", "mean_high",
                   "base_mean", "difference", "low", "high", "improved", "worsened"]


def summary_rows(analysis: Analysis, metrics: Metrics) -> list[dict]:
    """Every statistic as one row (``summary.csv``): means, paired comparisons, categories, drift, diversity."""
    rows = []
    for (metric, model), s in analysis.means.items():
        rows.append({"section": "mean", "metric": metric, "model": model, "kind": metrics.kind(metric, model),
                     "prompts": s.prompts, "mean": s.mean, "mean_low": s.interval.low, "mean_high": s.interval.high})
    for key, c in [*[(("", *k), v) for k, v in analysis.comparisons.items()], *analysis.categories.items()]:
        category, metric, model = key
        rows.append({"section": "category" if category else "paired", "metric": metric, "model": model,
                     "category": category, "kind": metrics.kind(metric, model), **_comparison(c)})
    for (space, model), s in analysis.drift.items():
        rows.append({"section": "drift", "metric": f"drift_{space}", "model": model, "kind": "signal",
                     "prompts": s.prompts, "mean": s.mean, "mean_low": s.interval.low, "mean_high": s.interval.high})
    for (space, model), c in analysis.diversity.items():
        rows.append({"section": "diversity", "metric": f"diversity_{space}", "model": model, "kind": "signal",
                     **_comparison(c)})
    return rows


def _comparison(c: Comparison) -> dict:
    return {"prompts": c.prompts, "mean": c.mean, "base_mean": c.base_mean, "difference": c.difference,
            "low": c.interval.low, "high": c.interval.high, "improved": c.improved, "worsened": c.worsened}


def write_summary(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        out.writeheader()
        for row in rows:
            out.writerow({k: number(v) if isinstance(v, float) else v for k, v in row.items()})
