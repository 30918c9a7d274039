"""Every figure docs/evaluating.md quotes of the kept evaluations is their data's: the command's printed output and
the quickstart's section from ``docs/data/evaluate/`` (``summary.csv``, cross-checked against ``scores.csv`` and
``diversity.csv``), the demo's section from ``docs/data/evaluate_hacking/summary.csv``. A rerun that changes the
files fails here until the page says what it measured, and a figure quoted there that no file gives fails too."""

import csv
import json
import re
import statistics
from pathlib import Path

import pytest

from flowrl.evaluation.report import fmt

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs/evaluating.md").read_text()
DATA = ROOT / "docs/data"
# a quoted figure: 2 or more decimals (settings such as guidance 4.5 or --margin 0.1 have one), or a percentage
FIGURE = re.compile(r"(?<![\d.])[+-]?\d+\.\d{2,}(?![\d.])|[+-]?\d+(?:\.\d+)?%")


def summary(folder: str) -> dict:
    with open(DATA / folder / "summary.csv", newline="") as f:
        return {(r["section"], r["metric"], r["model"], r["category"]): r for r in csv.DictReader(f)}


def num(row: dict, key: str) -> float:
    return float(row[key])


def f3(value: float, signed: bool = False) -> str:
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def change3(r: dict) -> str:
    return f"{f3(num(r, 'difference'), True)} [{f3(num(r, 'low'), True)}, {f3(num(r, 'high'), True)}]"


def pct(value: float, places: int = 0) -> str:
    return f"{100 * value:.{places}f}%"


def flat(text: str) -> str:
    return " ".join(text.split())  # a figure may wrap across lines


def section(title: str) -> str:
    return re.search(rf"\n## {re.escape(title)}\n(.*?)(?=\n## |\Z)", PAGE, re.S)[1]


@pytest.fixture(scope="module")
def quickstart() -> dict:
    """The figures of the quickstart's evaluation, each formatted as the page quotes it."""
    rows = summary("evaluate")
    alignment, colour = rows["paired", "digit_alignment", "quickstart", ""], rows["paired", "colour_match",
                                                                                  "quickstart", ""]
    pixels, features = (rows["diversity", f"diversity_{s}", "quickstart", ""] for s in ("pixels", "features"))
    drift = [rows["drift", f"drift_{s}", "quickstart", ""] for s in ("pixels", "features")]
    categories = [r for k, r in rows.items() if k[0] == "category" and k[1] == "digit_alignment"]
    return {"rows": rows, "alignment": alignment, "colour": colour, "pixels": pixels, "features": features,
            "drift": drift, "categories": categories}


def test_the_printed_output_is_the_commands_for_the_kept_run(quickstart):
    settings = json.loads((DATA / "evaluate/evaluation.json").read_text())
    block = re.search(r"prints \(the quickstart's checkpoint.*?\n```text\n(.*?)```", PAGE, re.S)[1]
    prompts, seeds = int(quickstart["alignment"]["prompts"]), len(settings["seeds"])
    assert (f"flowrl evaluate: base + quickstart on {settings['suite']} ({prompts} prompts x {seeds} seeds = "
            f"{prompts * seeds} images per model), {settings['num_steps']} ODE steps, guidance "
            f"{settings['guidance_scale']:g} ->") in block

    def change(r: dict) -> str:  # the report's format: 3 decimals, 3 significant digits below 0.1
        return f"{fmt(num(r, 'difference'), True)} [{fmt(num(r, 'low'), True)}, {fmt(num(r, 'high'), True)}]"

    q = quickstart
    verdict = (f"quickstart: reward-hacking flag. Trained digit_alignment {change(q['alignment'])} rose while "
               f"colour_match {change(q['colour'])}; diversity (pixels) {change(q['pixels'])}; diversity (features) "
               f"{change(q['features'])} fell, each beyond its interval.")
    assert f"  {verdict}\n" in block
    assert "+0.202 [+0.154, +0.252]" in verdict  # the format is the one the report prints, checked by hand


def test_the_quickstart_section_is_the_kept_summary(quickstart):
    q, text = quickstart, flat(section("The quickstart, evaluated"))
    a, c, p, f = q["alignment"], q["colour"], q["pixels"], q["features"]
    quoted = {
        "alignment": f"| digit alignment (trained) | {f3(num(a, 'base_mean'))} | {f3(num(a, 'mean'))} | "
                     f"**{change3(a)}** | {pct(num(a, 'improved'))} / {pct(num(a, 'worsened'))} |",
        "colour": f"| colour match (held-out) | {f3(num(c, 'base_mean'))} | {f3(num(c, 'mean'))} | {change3(c)} | "
                  f"{pct(num(c, 'improved'))} / {pct(num(c, 'worsened'))} |",
        "pixels": f"| diversity of a prompt's 4 seeds, pixels | {f3(num(p, 'base_mean'))} | {f3(num(p, 'mean'))} | "
                  f"{change3(p)} ({pct(-num(p, 'difference') / num(p, 'base_mean'), 1)} lower) | "
                  f"{pct(num(p, 'improved'))} / {pct(num(p, 'worsened'))} |",
        "features": f"| diversity, digit classifier's features | {f3(num(f, 'base_mean'))} | {f3(num(f, 'mean'))} | "
                    f"{change3(f)} ({pct(-num(f, 'difference') / num(f, 'base_mean'), 1)} lower) | "
                    f"{pct(num(f, 'improved'))} / {pct(num(f, 'worsened'))} |",
        "drift": "| drift from the base image, pixels / features | | " + " / ".join(
            f"{f3(num(r, 'mean'))} [{f3(num(r, 'mean_low'))}, {f3(num(r, 'mean_high'))}]" for r in q["drift"]),
        "categories": "By category, the alignment gain is {} on two digits of two colours ({} prompts), {} on two "
                      "digits of one colour ({}) and {} on one digit twice ({}).".format(
                          *[x for r in q["categories"] for x in (change3(r), int(r["prompts"]))]),
        "gain on": f"alignment up on {pct(num(a, 'improved'))} of prompts",
        "closer": f"a prompt's four seeds are {pct(-num(p, 'difference') / num(p, 'base_mean'), 1)} closer to each "
                  f"other in pixels and {pct(-num(f, 'difference') / num(f, 'base_mean'), 1)} closer",
        "colour falls": f"the held-out colour match falls ({f3(num(c, 'base_mean'))} -> {f3(num(c, 'mean'))}) on "
                        f"every prompt",
        # how far below 0 each interval ends, as a share of the base's mean: what --margin compares with
        "margins": f"its interval ends at {pct(-num(c, 'high') / num(c, 'base_mean'), 1)} of the base's mean) and "
                   f"the pixel diversity ({pct(-num(p, 'high') / num(p, 'base_mean'), 1)}) no longer raise it and the "
                   f"feature-space diversity ({pct(-num(f, 'high') / num(f, 'base_mean'), 1)}) still does",
    }
    for what, snippet in quoted.items():
        assert snippet in text, what
    assert num(c, "worsened") == 1.0  # "on every prompt"
    # the run's own validation, as its kept metrics.csv logged it (before the first step, after the last)
    with open(DATA / "quickstart_before/metrics.csv", newline="") as file:  # the settings of the evaluated checkpoint
        val = [float(r["val/reward/digit_alignment"]) for r in csv.DictReader(file) if r["val/reward/digit_alignment"]]
    assert f"validation, on other seeds, said {val[0]:.3f} -> {val[-1]:.3f}" in text
    # and nothing else: every figure of the section is one of those
    confidence = json.loads((DATA / "evaluate/evaluation.json").read_text())["confidence"]  # "95% interval"
    allowed = {m for snippet in [*quoted.values(), f"{val[0]:.3f} {val[-1]:.3f} {pct(confidence)}"]
               for m in FIGURE.findall(snippet)}
    assert set(FIGURE.findall(text)) - allowed == set()


def test_the_summary_is_the_scores_and_diversity_files(quickstart):
    """An independent reading of the per-image files gives the summary's means, changes and shares."""
    rows = quickstart["rows"]
    with open(DATA / "evaluate/scores.csv", newline="") as f:
        scores = [r for r in csv.DictReader(f)]
    with open(DATA / "evaluate/diversity.csv", newline="") as f:
        diversity = [r for r in csv.DictReader(f)]

    def per_prompt(records, model, key, value, match):
        by = {}
        for r in records:
            if r["model"] == model and match(r):
                by.setdefault(int(r["prompt_index"]), []).append(float(r[value]))
        return [statistics.fmean(by[p]) for p in sorted(by)]

    for metric in ("digit_alignment", "colour_match"):
        tuned, base = (per_prompt(scores, m, "metric", "value", lambda r: r["metric"] == metric)
                       for m in ("quickstart", "base"))
        r = rows["paired", metric, "quickstart", ""]
        assert statistics.fmean(tuned) == pytest.approx(num(r, "mean"), abs=1e-12)
        assert statistics.fmean(t - b for t, b in zip(tuned, base)) == pytest.approx(num(r, "difference"), abs=1e-12)
        assert sum(t > b for t, b in zip(tuned, base)) / len(base) == num(r, "improved")
    for space in ("pixels", "features"):
        tuned, base = (per_prompt(diversity, m, "space", "diversity", lambda r: r["space"] == space)
                       for m in ("quickstart", "base"))
        r = rows["diversity", f"diversity_{space}", "quickstart", ""]
        assert len(base) == len(tuned) == 128
        assert (statistics.fmean(base), statistics.fmean(tuned)) == pytest.approx(
            (num(r, "base_mean"), num(r, "mean")), abs=1e-12)
        assert sum(t < b for t, b in zip(tuned, base)) / 128 == num(r, "worsened")


def test_the_hacking_demo_section_is_its_kept_summary():
    rows, text = summary("evaluate_hacking"), flat(section("Reward hacking, caught"))
    alignment = [rows["paired", "digit_alignment", f"step{k}", ""] for k in (4, 8, 12)]
    bright = rows["paired", "brightness", "step4", ""]
    quoted = (f"digit alignment falls: {change3(alignment[0])} at step 4, when brightness has gained only "
              f"{f3(num(bright, 'difference'))} over the base's {f3(num(bright, 'base_mean'))}, then "
              f"{f3(num(alignment[1], 'difference'), True)} and {f3(num(alignment[2], 'difference'), True)}.")
    assert quoted in text
    assert all(num(rows["paired", "brightness", f"step{k}", ""], "low") > 0 for k in (4, 8, 12))  # "rises at every"
    assert set(FIGURE.findall(text)) - set(FIGURE.findall(quoted)) == set()
