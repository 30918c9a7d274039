"""docs/results.md's comparison of every step-credit method at one budget, one commit: its table and its per-seed
check of the goal, from ``docs/data/method_comparison/<config>_2026_seed<k>.csv``.

The runs: ``scripts/compare_methods.py --budget 32000 --prompts 4 --seeds 0 1 2 --jobs 2 --kept
docs/data/method_comparison --tag 2026`` (every step-credit method by default; a kept run whose first batches
reproduce is reused). The goal (issue 36): a dense or tree method at its default settings reaches Flow-GRPO's final
held-out reward with at most half its model evaluations, by at least two standard errors over 6 seeds; read here as
the paired difference, per seed, of the method's held-out reward at its last validation by half of its evaluations
minus Flow-GRPO's at the end, whose mean must be at least twice its standard error.
"""

from __future__ import annotations

import statistics

import plot_rewards as pr
from results_data import DATA, ROOT, Run, md, recorded, run

MC = "method_comparison"
#: (label, kept stem, how it gives a step its credit), Flow-GRPO first: the reference of the goal
ONE_BUDGET = [
    ("Flow-GRPO", "flow_grpo_2026", "the outcome, every step alike"),
    ("one-step gain", "step_gain_2026", "r(x0_hat) after minus before the step, from the sampler's own velocity"),
    ("MixGRPO", "mix_grpo_2026", "the outcome, on a sliding window of 3 SDE steps"),
    ("G²RPO", "g2rpo_2026", "one SDE step from a shared ODE anchor, completed at 2 granularities"),
    ("GCPO", "gcpo_2026", "the outcome, a ratio and clip per chunk of steps"),
    ("Flash-GRPO", "flash_grpo_2026", "the outcome, on one SDE step per prompt group"),
    ("DenseGRPO", "dense_grpo_2026", "r(ODE completion) after minus before the step, calibrated noise"),
    ("TP-GRPO", "tp_grpo_2026", "the step's completion gain, the reward to the end at turning points"),
    ("TempFlow-GRPO", "tempflow_grpo_2026", "one SDE branch per seed and step from an ODE trunk, completed"),
    ("Dynamic-TreeRPO", "tree_rpo_2026", "the node's value in a binary tree inside a sliding SDE window"),
    ("BranchGRPO", "branch_grpo_2026", "the node's value fused from its leaves, per depth"),
]
SEEDS = (0, 1, 2)


def mean_se(values: list[float], sign: bool = True) -> str:
    """``mean +- standard error`` (one value: the value alone).

    >>> mean_se([0.01, 0.03]), mean_se([0.5], sign=False)
    ('+0.020 +- 0.010', '0.500')
    """
    mean = f"{statistics.fmean(values):+.3f}" if sign else f"{statistics.fmean(values):.3f}"
    if len(values) < 2:
        return mean
    return f"{mean} +- {statistics.stdev(values) / len(values) ** 0.5:.3f}"


def by_half_minus(r: Run, reference: Run) -> list[float]:
    """Per seed, ``r``'s held-out reward at its last validation by half of its evaluations minus ``reference``'s at
    the end (paired by seed: the seed fixes the validation noise)."""
    if [s.seed for s in r] != [s.seed for s in reference]:
        raise SystemExit(f"seeds {[s.seed for s in r]} against the reference's {[s.seed for s in reference]}")
    return [s.half()[1] - ref.after for s, ref in zip(r, reference)]


def goal_cell(diffs: list[float]) -> str:
    """The goal's difference, mean +- standard error, how many seeds reach it, and whether it is met."""
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
    met = "met" if len(diffs) >= 6 and mean >= 2 * se else "not met"
    return f"{mean_se(diffs)} ({sum(d >= 0 for d in diffs)} of {len(diffs)} seeds >= 0; {met})"


def one_budget(rows=ONE_BUDGET, seeds=SEEDS) -> str:
    """The table: per method its cost, held-out reward before -> after, gain and the goal's difference (mean +-
    standard error over the seeds), and the wall minutes and CPU seconds from ``docs/data/recorded.csv``."""
    runs = [(label, run(MC, stem, seeds), stem, credit) for label, stem, credit in rows]
    reference = runs[0][1]
    cells = []
    for label, r, stem, credit in runs:
        costs = sorted({round(v) for s in r for v in s.batch_evals})
        cells.append([label, credit, " -> ".join(f"{c:,}" for c in (costs[-1], costs[0]) if len(costs) > 1)
                      or f"{costs[0]:,}", f"{statistics.fmean(len(s.train) for s in r):,.0f}",
                      f"{statistics.fmean(s.total for s in r):,.0f}",
                      f"{mean_se([s.before for s in r], sign=False)} -> {mean_se([s.after for s in r], sign=False)}",
                      mean_se([s.after - s.before for s in r]),
                      "-" if r is reference else goal_cell(by_half_minus(r, reference)),
                      *(recorded(quantity, f"{MC}/{stem}") or "-" for quantity in ("wall_minutes", "cpu_seconds"))])
    return md(["method (mean +- standard error over seeds 0-2)", "a step's credit", "evaluations per batch",
               "batches", "evaluations spent", "held-out before -> after", "gain",
               "by half minus Flow-GRPO's final", "wall minutes", "CPU seconds"], cells)


def blocks() -> dict[str, str]:
    """The section's blocks, in page order."""
    return {"one-budget": one_budget()}


#: the page's plots: file under docs/ -> the ``ONE_BUDGET`` labels drawn (matplotlib's cycle has 10 colours)
PLOTS = {"method_comparison_one_budget.png": ["Flow-GRPO", "one-step gain", "MixGRPO", "G²RPO", "GCPO", "Flash-GRPO"],
         "method_comparison_one_budget_dense.png": ["Flow-GRPO", "one-step gain", "DenseGRPO", "TP-GRPO",
                                                    "TempFlow-GRPO", "Dynamic-TreeRPO", "BranchGRPO"]}


def plot_runs(labels: list[str], rows=ONE_BUDGET, seeds=SEEDS) -> dict[str, list]:
    """``plot_rewards.plot``'s runs for ``labels``: each label's kept files, one per seed."""
    stems = {label: stem for label, stem, _ in rows}
    return {label: [DATA / MC / f"{stems[label]}_seed{s}.csv" for s in seeds] for label in labels}


if __name__ == "__main__":  # python scripts/results_one_budget.py: redraw the section's plots
    for name, labels in PLOTS.items():
        pr.plot(plot_runs(labels), ROOT / "docs" / name, x="evaluations", split=True)
