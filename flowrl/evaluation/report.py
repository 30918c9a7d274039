"""The report folder of ``python -m flowrl evaluate``: ``report.md`` and an offline ``report.html`` (the same blocks),
``chart.png`` (paired differences with intervals), ``grid.png`` (the same noise across models), and the data:
``scores.csv``, ``diversity.csv``, ``summary.csv`` and ``evaluation.json`` (the settings)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from flowrl.evaluation import document as doc
from flowrl.evaluation.figures import difference_chart, paired_grid
from flowrl.evaluation.metrics import Metrics
from flowrl.evaluation.results import (Analysis, SPACES, Table, summary_rows, write_diversity, write_scores,
                                       write_summary)
from flowrl.evaluation.stats import Comparison, Interval, Summary
from flowrl.evaluation.suites import Suite

@dataclass(frozen=True)
class Settings:
    """What the report states about how it was made (written to ``evaluation.json`` too)."""

    models: dict[str, str]  # name -> where its weights came from
    suite: str
    seeds: list[int]
    num_steps: int
    guidance_scale: float
    features: Optional[str]
    resamples: int
    confidence: float
    bootstrap_seed: int
    margin: float
    command: str


def fmt(value: float, signed: bool = False) -> str:
    """A number for a table: 3 decimals, or 3 significant digits below 0.1; ``n/a`` for NaN.

    >>> fmt(0.71234), fmt(0.0012345, signed=True), fmt(-0.25, signed=True), fmt(float("nan"))
    ('0.712', '+0.00123', '-0.250', 'n/a')
    """
    if value is None or math.isnan(value):
        return "n/a"
    sign = "+" if signed else ""
    return f"{value:{sign}.3f}" if abs(value) >= 0.1 or value == 0 else f"{value:{sign}.3g}"


def interval(i: Interval, signed: bool = False) -> str:
    return f"[{fmt(i.low, signed)}, {fmt(i.high, signed)}]"


def change(c: Comparison) -> str:
    """``+0.245 [+0.221, +0.270]``."""
    return f"{fmt(c.difference, True)} {interval(c.interval, True)}"


def share(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def verdicts(analysis: Analysis, metrics: Metrics) -> list[str]:
    """One line per tuned model: the flag, and what raised it or why it stayed down."""
    lines = []
    for model, flag in analysis.flags.items():
        gains = "; ".join(f"{m} {change(c)}" for m, c in flag.gains.items())
        if flag.raised:
            falls = "; ".join(f"{m} {change(c)}" for m, c in flag.falls.items())
            lines.append(f"**{model}: reward-hacking flag.** Trained {gains} rose while {falls} fell, each beyond "
                         "its interval.")
        elif not metrics.trained.get(model):
            lines.append(f"{model}: no flag (no trained reward among the metrics to compare with)")
        elif not flag.gains:
            lines.append(f"{model}: no flag (no trained reward rose beyond its interval)")
        elif not flag.watched:
            lines.append(f"{model}: no flag can be read. Trained {gains} rose, and nothing was watched: add a "
                         "held-out reward (--held_out), and 2 or more seeds for the diversity.")
        else:
            lines.append(f"{model}: no flag. Trained {gains} rose; no held-out reward or diversity fell beyond its "
                         "interval.")
    return lines


def reward_table(analysis: Analysis, metrics: Metrics, models: list[str], confidence: float) -> doc.Table:
    pct = f"{100 * confidence:.0f}%"
    header = ["metric", "kind", "model", f"mean [{pct}]", f"change vs base [{pct}]", "prompts better", "worse",
              "prompts"]
    rows = []
    for metric in metrics.names:
        for model in models:
            s: Summary = analysis.means[metric, model]
            c = analysis.comparisons.get((metric, model))
            rows.append([metric, metrics.kind(metric, model), model, f"{fmt(s.mean)} {interval(s.interval)}",
                         change(c) if c else "", share(c.improved) if c else "", share(c.worsened) if c else "",
                         str(s.prompts)])
    return doc.Table(header, rows)


def signal_table(analysis: Analysis, models: list[str]) -> doc.Table:
    rows = []
    for space in SPACES:
        for model in models[1:]:
            if (space, model) in analysis.drift:
                s = analysis.drift[space, model]
                rows.append([f"drift from base ({space})", model, "0", f"{fmt(s.mean)} {interval(s.interval)}",
                             "", "", ""])
    for space in SPACES:
        for model in models[1:]:
            if (space, model) in analysis.diversity:
                c = analysis.diversity[space, model]
                rows.append([f"diversity of a prompt's seeds ({space})", model, fmt(c.base_mean), fmt(c.mean),
                             change(c), share(c.improved), share(c.worsened)])
    return doc.Table(["signal", "model", "base", "model's", "change vs base", "prompts higher", "lower"], rows)


def category_table(analysis: Analysis, categories: list[Optional[str]]) -> doc.Table:
    counts = {c: categories.count(c) for c in dict.fromkeys(categories) if c is not None}
    rows = [[category, str(counts[category]), metric, model, fmt(c.base_mean), fmt(c.mean), change(c),
             share(c.improved)] for (category, metric, model), c in analysis.categories.items()]
    return doc.Table(["category", "prompts", "metric", "model", "base", "model's", "change vs base",
                      "prompts better"], rows)


def chart_panels(analysis: Analysis, metrics: Metrics) -> list[tuple[str, dict]]:
    panels = []
    for metric in metrics.names:
        bars = {m: (c.difference, c.interval.low, c.interval.high) for (name, m), c in analysis.comparisons.items()
                if name == metric}
        kinds = sorted({metrics.kind(metric, m) for m in bars})
        panels.append((f"{metric} ({', '.join(kinds)} reward)", bars))
    for space in SPACES:
        if bars := {m: (c.difference, c.interval.low, c.interval.high)
                    for (s, m), c in analysis.diversity.items() if s == space}:
            panels.append((f"diversity of a prompt's seeds ({space}; lower: more alike)", bars))
    for space in SPACES:
        if bars := {m: (s.mean, s.interval.low, s.interval.high) for (sp, m), s in analysis.drift.items()
                    if sp == space}:
            panels.append((f"drift from the base image of the same noise ({space}; a distance, not a change)", bars))
    return panels


def caption(value: float) -> str:
    """A score under an image: 3 decimals, whatever its size (a column of them lines up).

    >>> caption(0.7123), caption(3.2e-9), caption(float("nan"))
    ('0.712', '0.000', 'n/a')
    """
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def grid_rows(table: Table, suite: Suite, images: dict, metrics: Metrics, prompts: list[int],
              seeds: list[int]) -> list:
    """The grid's rows: per prompt, its label (the prompt, then its category) and, per seed and model, the image and
    the scores of (up to) the first three metrics, each ``name score`` whole (the grid wraps them to its cells)."""
    shown = metrics.names[:3]
    rows = []
    for p in prompts:
        columns = [table.seeds.index(s) for s in seeds]
        pictures = [[images[m, p, s] for m in table.models] for s in seeds]
        captions = [[[f"{name} {caption(table.scores[name, m][p, j])}" for name in shown] for m in table.models]
                    for j in columns]
        label = "\n".join([suite.prompts[p], *([suite.categories[p]] if suite.categories[p] else [])])
        rows.append((label, pictures, captions))
    return rows


def write_report(out: Path, settings: Settings, suite: Suite, metrics: Metrics, table: Table, analysis: Analysis,
                 images: dict, grid: tuple[list[int], list[int]]) -> Path:
    """Writes the report folder ``out``; returns ``report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    write_scores(out / "scores.csv", table, suite)
    write_diversity(out / "diversity.csv", table, suite)
    write_summary(out / "summary.csv", summary_rows(analysis, metrics))
    (out / "evaluation.json").write_text(json.dumps({**asdict(settings), "trained": metrics.trained}, indent=2))
    figures = []
    if panels := [p for p in chart_panels(analysis, metrics) if p[1]]:
        figures.append(doc.Figure(difference_chart(panels, out / "chart.png").name, "paired differences"))
    prompts, seeds = grid
    if prompts and seeds:
        grid_file = paired_grid(grid_rows(table, suite, images, metrics, prompts, seeds), seeds, table.models,
                                out / "grid.png")
    models = table.models
    pct = f"{100 * settings.confidence:.0f}%"
    title = (f"Evaluation: {', '.join(models[1:])} against base on {settings.suite}" if len(models) > 1 else
             f"Evaluation: base on {settings.suite}")
    blocks: list[doc.Block] = [
        doc.Heading(title, 1),
        doc.Paragraph(f"{len(suite)} prompts x {len(settings.seeds)} seeds ({' '.join(map(str, settings.seeds))}), "
                      f"{settings.num_steps} ODE steps, guidance {settings.guidance_scale:g}; every model drew each "
                      "(prompt, seed) from the same initial noise, so every change below is paired. Intervals: "
                      f"{pct} percentile bootstrap over prompts ({settings.resamples} resamples, seed "
                      f"{settings.bootstrap_seed})."),
        doc.Table(["model", "weights"], [[name, f"`{source}`"] for name, source in settings.models.items()]),
        doc.Heading("Verdict"), doc.Bullets(verdicts(analysis, metrics) or ["only the base model was evaluated"]),
        doc.Heading("Rewards"), reward_table(analysis, metrics, models, settings.confidence)]
    if len(models) > 1:
        spaces = (f"in pixels (RMS, 0 to 1) and in the image features of `{settings.features}` (cosine distance)"
                  if settings.features else "in pixels (RMS, 0 to 1) only (no feature space, see `--features`)")
        diversity = ("Diversity: the mean distance between a prompt's seeds." if len(settings.seeds) > 1 else
                     "Diversity needs 2 or more seeds (`--seeds`).")
        blocks += [doc.Heading("Reward-hacking signals"),
                   doc.Paragraph(f"Drift: how far each tuned image is from the base image of the same noise. "
                                 f"{diversity} Distances {spaces}."),
                   signal_table(analysis, models), *figures]
    if analysis.categories:
        blocks += [doc.Heading("By category"), category_table(analysis, suite.categories)]
    if prompts and seeds:
        blocks += [doc.Heading("Images"),
                   doc.Paragraph("One prompt per row; for each seed (one initial noise) every model's image side by "
                                 "side, its scores under it. Every image is in `images/<model>/` unless the run "
                                 "passed `--no_images`."),
                   doc.Figure(grid_file.name, "the same noise across models")]
    blocks += [doc.Heading("How to read this"), doc.Bullets(READING),
               doc.Paragraph("More: the Evaluating page of flowrl's documentation (`docs/evaluating.md`).")]
    (out / "report.md").write_text(doc.to_markdown(blocks))
    (out / "report.html").write_text(doc.to_html(blocks, out, title))
    return out / "report.md"


READING = [
    "**change vs base**: per prompt, the mean over its seeds of (model - base) on the same noise; then the mean over "
    "prompts. Its interval resamples prompts, so it says how much the number would move on another draw of prompts "
    "like these; an interval that excludes 0 is a change beyond that noise.",
    "**prompts better / worse**: the share of prompts whose paired change is above / below 0.",
    "**trained / held-out**: trained rewards had a non-zero weight in the tuned model's run config; every other "
    "metric is held-out for it.",
    "**the flag**: raised when a trained reward rose beyond its interval while a held-out reward or a diversity fell "
    "beyond its own: the tuned model buys its reward with something it was not asked to give up.",
    "**drift**: no flag reads it; a large drift with a small reward gain means the model changed more than the "
    "reward explains.",
]

