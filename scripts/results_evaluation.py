"""The Results page's blocks from the kept evaluations (``python -m flowrl evaluate``): the quickstart's checkpoint
against its base (``docs/data/evaluate/``, ``scripts/evaluate_quickstart.py``) and the reward-hacking demo
(``docs/data/evaluate_hacking/``, ``scripts/demo_reward_hacking.py``), read from their ``summary.csv`` and
``evaluation.json``."""

from __future__ import annotations

import csv
import json

from results_data import DATA, md

LABELS = {"digit_alignment": "digit alignment", "colour_match": "colour match", "brightness": "brightness",
          "pixels": "pixels", "features": "the digit classifier's features"}


def summary(folder: str) -> tuple[dict[tuple[str, str, str, str], dict], dict]:
    """``summary.csv`` of ``docs/data/<folder>`` keyed by (section, metric, model, category), numbers as floats; and
    its ``evaluation.json``."""
    with open(DATA / folder / "summary.csv", newline="") as f:
        rows = {(r["section"], r["metric"], r["model"], r["category"]): {
            k: (v if k in ("section", "metric", "model", "category", "kind") else float(v) if v else None)
            for k, v in r.items()} for r in csv.DictReader(f)}
    return rows, json.loads((DATA / folder / "evaluation.json").read_text())


def change(r: dict, digits: int = 3) -> str:
    """A paired change and its interval: ``+0.202 [+0.154, +0.252]``."""
    return f"{r['difference']:+.{digits}f} [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}]"


def digits(changes: list[dict]) -> int:
    """Decimals for a column of changes: 4 where every interval lies within +-0.05 (3 would leave 2 figures)."""
    return 4 if max(max(abs(r["low"]), abs(r["high"])) for r in changes) < 0.05 else 3


def spread(r: dict) -> str:
    """A mean and its interval: ``0.083 [0.081, 0.086]``."""
    return f"{r['mean']:.3f} [{r['mean_low']:.3f}, {r['mean_high']:.3f}]"


def relative(r: dict) -> str:
    """A change as a share of the base's mean, its sign in words: ``9.5% lower``."""
    return f"{100 * abs(r['difference']) / r['base_mean']:.1f}% {'lower' if r['difference'] < 0 else 'higher'}"


def shares(r: dict) -> str:
    return f"{100 * r['improved']:.0f}% / {100 * r['worsened']:.0f}%"


def quickstart_evaluated() -> str:
    """The quickstart against the base: rewards, diversity, drift, and the trained reward by category."""
    rows, settings = summary("evaluate")
    tuned = list(settings["models"])[1]
    seeds = settings["seeds"]
    cells = []
    for (section, metric, model, category), r in rows.items():
        if section == "paired" and model == tuned:
            cells.append([f"{LABELS[metric]} ({r['kind']})", f"{r['base_mean']:.3f}", f"{r['mean']:.3f}", change(r),
                          shares(r)])
    for space in ("pixels", "features"):
        r = rows["diversity", f"diversity_{space}", tuned, ""]
        cells.append([f"diversity of a prompt's {len(seeds)} seeds, {LABELS[space]}", f"{r['base_mean']:.3f}",
                      f"{r['mean']:.3f}", f"{change(r)} ({relative(r)})", shares(r)])
    for space in ("pixels", "features"):
        cells.append([f"drift from the base image of the same noise, {LABELS[space]}", "",
                      spread(rows["drift", f"drift_{space}", tuned, ""]), "", ""])
    for (section, metric, model, category), r in rows.items():
        if section == "category" and r["kind"] == "trained" and model == tuned:
            cells.append([f"{LABELS[metric]}, {category} ({r['prompts']:.0f} prompts)", f"{r['base_mean']:.3f}",
                          f"{r['mean']:.3f}", change(r), shares(r)])
    prompts = next(r["prompts"] for (s, *_), r in rows.items() if s == "paired")
    return md([f"{tuned} against the base, {settings['suite']} ({prompts:.0f} prompts) x seeds {seeds[0]}-{seeds[-1]}",
               "base",
               tuned, "change [95% interval over prompts]", "prompts better (higher) / worse (lower)"], cells)


def hacking_demo() -> str:
    """Each checkpoint of the brightness run against the base: the paired change of every metric and diversity."""
    rows, settings = summary("evaluate_hacking")
    base, *tuned = settings["models"]
    metrics = list(dict.fromkeys(m for (s, m, _, _) in rows if s == "paired"))
    spaces = ("pixels", "features")
    columns = [("paired", m) for m in metrics] + [("diversity", f"diversity_{space}") for space in spaces]
    places = {c: digits([rows[(*c, model, "")] for model in tuned]) for c in columns}
    kinds = {m: rows["paired", m, tuned[0], ""]["kind"] for m in metrics}
    header = ["model"] + [f"{LABELS[m]} ({kinds[m]})" for m in metrics] + [f"diversity, {LABELS[s]}" for s in spaces]
    first = [rows["mean", m, base, ""]["mean"] for m in metrics] + [
        rows["diversity", f"diversity_{s}", tuned[0], ""]["base_mean"] for s in spaces]
    cells = [[f"{base} (its mean)"] + [f"{v:.{places[c]}f}" for v, c in zip(first, columns)]]
    for model in tuned:
        cells.append([f"{model} (change vs base)"] + [change(rows[(*c, model, "")], places[c]) for c in columns])
    return md(header, cells)
