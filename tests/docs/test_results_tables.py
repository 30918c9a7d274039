"""docs/results.md is what ``scripts/plot_rewards.py --results`` prints from the runs kept in docs/data/: every table,
and every figure its prose quotes. A number edited on the page by hand fails here."""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs/results.md").read_text()


@pytest.fixture(scope="module")
def printed():
    """The script's output, run as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "scripts/plot_rewards.py"), "--results"], capture_output=True,
                          text=True, timeout=120, check=True, cwd=ROOT, env=env).stdout


def test_every_table_on_the_page_is_the_scripts_output(printed, tables):
    blocks = re.findall(r"<!-- results:\S+ -->.*?<!-- /results:\S+ -->", printed, flags=re.S)
    assert len(blocks) == 19
    for block in blocks:
        assert block in PAGE, block[:200]
    # and the page holds no block the script no longer prints
    assert re.findall(r"<!-- results:(\S+) -->", PAGE) == re.findall(r"<!-- results:(\S+) -->", printed)
    assert tables.problems(PAGE, tables.blocks()) == []


def test_a_number_edited_by_hand_fails(tables):
    made = tables.blocks()
    edits = {
        "a table cell": ("| Dynamic-TreeRPO | 108 |", "| Dynamic-TreeRPO | 73 |"),
        "a per-seed figure in a table": ("| 0.495 | 0.430 |", "| 0.495 | 0.495 |"),
        "a figure the prose quotes": ("(0.578 against 0.570)", "(0.578 against 0.571)"),
        "a gain the prose quotes": ("final (-0.013 +- 0.016)", "final (-0.012 +- 0.016)"),
        "a count of batches": ("barely moves in 25 batches", "barely moves in 26 batches"),
        "a percentage": ("three seeds (61% / 52% / 52%", "three seeds (61% / 52% / 53%"),
    }
    for what, (before, after) in edits.items():
        assert PAGE.count(before) == 1, what
        assert tables.problems(PAGE.replace(before, after), made), what
    # a block removed from the page, or one the script does not print, fails too
    name = "layer-tuning"
    cut = re.sub(rf"<!-- results:{name} -->.*?<!-- /results:{name} -->", "", PAGE, flags=re.S)
    assert f"block {name!r}: missing from the page" in tables.problems(cut, made)
    assert tables.problems(PAGE + "\n<!-- results:old -->\n\n| 1 |\n\n<!-- /results:old -->\n", made) == [
        "block 'old' on the page is not one the script prints"]


def test_the_issues_figures_are_what_the_data_gives(printed):
    """The corrections of issue 24, recomputed from the kept runs."""
    papers = re.search(r"\| Dynamic-TreeRPO \| (\d+) \| ([\d,]+) -> (\d+) \|", printed)
    assert papers.groups() == ("108", "444", "264")  # the window slides: 108 batches, not the 73 of 32,000 / 444
    half = re.search(r"\n\| minus Flow-GRPO at 32,000, mean \+- standard error \|(.*)\|\n", printed)[1].split("|")
    # columns: before, Flow-GRPO, late window by half, at its end, TempFlow by half, at 50.4 %, at its end
    assert half[4].strip() == "-0.013 +- 0.016 (3 of 6 seeds >= 0)"  # strictly by half: its validation at 8,064
    assert half[5].strip() == "+0.011 +- 0.010 (4 of 6 seeds >= 0)"  # what the page quoted, at 50.4 %
    assert "TempFlow-GRPO 1-step at 8,064 (25.2 %, the last by half)" in printed
    assert "Dynamic-TreeRPO late window at 15,912 (49.7 %, the last by half)" in printed
    # Flow-GRPO on the 4-step base, seed 2: 0.495 at half, 0.430 at three quarters
    assert "| 2 | 0.403 | 0.448 | 0.495 | 0.430 | 0.358 | 0.370 |" in printed


def test_the_evaluation_blocks_are_the_kept_summaries(tables, tmp_path, monkeypatch):
    """The two evaluation tables read docs/data/evaluate*/summary.csv: a changed file changes the page's cells."""
    import results_evaluation

    made = tables.blocks()
    # the quickstart's paired change of digit alignment, summary.csv's row read by hand: +0.20195 [+0.15398, +0.25168],
    # better on 95 of 128 prompts (0.742), base 0.44920 -> 0.65116
    assert "| digit alignment (trained) | 0.449 | 0.651 | +0.202 [+0.154, +0.252] | 74% / 26% |" in made[
        "quickstart-evaluated"]
    edited = {("evaluate", "quickstart"): "0.30195238344510155", ("evaluate_hacking", "step4"): "-0.5"}
    for (folder, model), difference in edited.items():  # the paired change of digit alignment, edited
        (tmp_path / folder).mkdir()
        shutil.copy(ROOT / "docs/data" / folder / "evaluation.json", tmp_path / folder)
        with open(ROOT / "docs/data" / folder / "summary.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            if (row["section"], row["metric"], row["model"]) == ("paired", "digit_alignment", model):
                row["difference"] = difference
        with open(tmp_path / folder / "summary.csv", "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0]))
            out.writeheader()
            out.writerows(rows)
    monkeypatch.setattr(results_evaluation, "DATA", tmp_path)
    assert "| +0.302 [+0.154, +0.252] |" in results_evaluation.quickstart_evaluated()
    assert re.search(r"\| step4 \(change vs base\) \| [^|]+ \| -0\.500 \[", results_evaluation.hacking_demo())
    assert tables.problems(PAGE, {**made, "quickstart-evaluated": results_evaluation.quickstart_evaluated()})


def test_the_gain_by_half_is_defined_once(tables):
    from plot_rewards import HALF_RULE

    assert PAGE.count(HALF_RULE) == 1
    help_text = subprocess.run([sys.executable, str(ROOT / "scripts/plot_rewards.py"), "--help"],
                               capture_output=True, text=True, timeout=120, check=True).stdout
    assert "the last validation" in " ".join(help_text.split())  # argparse rewraps the epilog
    assert " ".join(HALF_RULE.split()) in " ".join(help_text.split())


def test_the_2026_drift_block_reads_its_runs_drift_and_flow_dppo_is_flow_grpo_at_one_update(tables, tmp_path,
                                                                                          monkeypatch):
    """The prose's claims of the 2026 section: Flow-DPPO's kept runs equal Flow-GRPO's on every column both log but
    the forward passes and the wall-clock rate, and the drift block prints each seed's KL of the kept drift file (a
    changed KL changes the block)."""
    mc = ROOT / "docs/data/method_comparison"
    for seed in (0, 1, 2):
        with open(mc / f"flow_grpo_2026_seed{seed}.csv") as f, open(mc / f"dppo_seed{seed}.csv") as g:
            a, b = list(csv.DictReader(f)), list(csv.DictReader(g))
        shared = (set(a[0]) & set(b[0])) - {"train/forward_passes", "rollout/samples_per_s"}
        assert len(a) == len(b) == 106 and len(shared) > 20
        assert all(x[c] == y[c] for x, y in zip(a, b) for c in shared)
        assert any(x["train/forward_passes"] != y["train/forward_passes"] for x, y in zip(a, b))
    block = tables.blocks()["methods-2026-drift"]
    assert "| Flow-GRPO | 0.066 / 0.129 / 0.065 | 0.087 +- 0.037 |" in block
    with open(tables.DRIFT_2026) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["method"] == "GRPO-Guard" and row["seed"] == "1":
            row["kl"] = "0.5"
    changed = tmp_path / "drift.csv"
    with open(changed, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    monkeypatch.setattr(tables, "DRIFT_2026", changed)
    assert "| GRPO-Guard, loss grpo_guard | 0.043 / 0.500 / 0.039 |" in tables.blocks()["methods-2026-drift"]


def test_the_one_budget_goal_is_the_paired_difference_by_half_read_from_the_kept_files(tables):
    """The goal column of the one-budget table, recomputed here from the kept CSVs without the scripts' helpers: per
    seed, the method's held-out reward at its last validation at or before half of its evaluations minus
    Flow-GRPO's last; and "met" only with 6 seeds and a mean at least twice its standard error."""
    import statistics

    from results_one_budget import goal_cell

    def validations(stem, seed):
        with open(ROOT / f"docs/data/method_comparison/{stem}_seed{seed}.csv") as f:
            spent, points = 0.0, []
            for row in csv.DictReader(f):
                spent += float(row["rollout/evaluations"] or 0)
                if row["val/reward/total"]:
                    points.append((spent, float(row["val/reward/total"])))
        return points, spent

    diffs = []
    for seed in (0, 1, 2):
        points, total = validations("step_gain_2026", seed)
        flow_grpo, _ = validations("flow_grpo_2026", seed)
        diffs.append([y for x, y in points if x <= total / 2][-1] - flow_grpo[-1][1])
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / 3 ** 0.5
    row = next(line for line in tables.blocks()["one-budget"].splitlines() if line.startswith("| one-step gain |"))
    assert f"{mean:+.3f} +- {se:.3f} ({sum(d >= 0 for d in diffs)} of 3 seeds >= 0; not met)" in row
    assert goal_cell([0.02, 0.03, 0.01, 0.02, 0.03, 0.01]).endswith("; met)")  # mean 0.02, s.e. 0.0037
    assert goal_cell([0.02, 0.03, 0.01]).endswith("; not met)")  # 3 seeds never claim it
    assert goal_cell([0.05, -0.04, 0.01, 0.02, 0.03, -0.01]).endswith("; not met)")  # mean 0.01, s.e. 0.013
