"""The tables of docs/results.md and the per-seed figures its prose quotes, computed from the runs kept in docs/data/.

    python scripts/plot_rewards.py --results           # every block, as the page holds it
    python scripts/plot_rewards.py --results --write   # paste them into docs/results.md in place

On the page a block lies between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``. :func:`problems` holds
the page to them (tests/docs/test_results_tables.py): each block as printed here, and every figure its prose quotes
(see ``FIGURE``) one of the numbers of the blocks in its section, outside passages between ``<!-- unkept -->`` and
``<!-- /unkept -->`` (runs whose metrics were not kept). The wall minutes, which the kept metrics cannot give
(they were read from TensorBoard events that were not kept), come from ``docs/data/recorded.csv``, with their source.
"""

from __future__ import annotations

import csv
import re
import statistics

import plot_rewards as pr
from results_evaluation import hacking_demo, quickstart_evaluated
from results_one_budget import blocks as one_budget_blocks
from results_data import CEILING, DATA, ROOT, Run, eighths, load, md, recorded, run, share, signed

PAGE = ROOT / "docs" / "results.md"
MC = "method_comparison"


def per_batch(run: Run) -> str:
    """Evaluations per batch: one number, or the first batch's extra (DenseGRPO's calibration), or first -> last
    (Dynamic-TreeRPO's sliding window)."""
    e = [round(v) for v in run[0].batch_evals]
    if len(set(e)) == 1:
        return f"{e[0]:,}"
    return f"{e[1]:,} (+{e[0] - e[1]:,} in the first)" if len(set(e[1:])) == 1 else f"{e[0]:,} -> {e[-1]:,}"


def per_transition(run: Run) -> str:
    v = run[0].per_transition
    return "-" if not v else f"{v[0]:.2f}" if f"{v[0]:.2f}" == f"{v[-1]:.2f}" else f"{v[0]:.2f} -> {v[-1]:.2f}"


def half_gain(run: Run) -> str:
    """The gain by half (``pr.HALF_RULE``), or what stands in for it when a run validated only after half."""
    if all(s.half()[0] == 0 for s in run):  # the last validation by half is the base itself: no gain measured
        x = run[0].points[1][0]
        return f"no validation by half (the first at {x:,.0f}, {100 * x / run[0].total:.1f} %)"
    return signed([s.half()[1] - s.before for s in run])


COLUMNS = {  # header, cell of a run (the label, its seeds, the recorded.csv key of its wall minutes)
    "batches": ("batches", lambda r, key: f"{statistics.fmean(len(s.train) for s in r):,.0f}"),
    "cost": ("evaluations per batch", lambda r, key: per_batch(r)),
    "transition": ("per trained transition", lambda r, key: per_transition(r)),
    "per_sample": ("evaluations per sample (a CFG pair once)", lambda r, key: f"{r[0].nfe / len(r[0].train):g}"),
    "before": ("held-out before", lambda r, key: pr.mean_std([s.before for s in r])),
    "after": ("held-out after", lambda r, key: pr.mean_std([s.after for s in r])),
    "gain": ("gain", lambda r, key: signed([s.after - s.before for s in r])),
    "half": ("gain by half", lambda r, key: half_gain(r)),
    "minutes": ("wall minutes", lambda r, key: recorded("wall_minutes", key) or "-"),
}


def method_table(first: str, rows: list[tuple[str, Run, str]], columns: list[str], compete: int | None = None,
                 bold: bool = True) -> str:
    """A row per run; the best held-out reward, gain and gain by half in bold among the first ``compete`` rows
    (those run at one budget)."""
    cells = [[label] + [COLUMNS[c][1](r, key) for c in columns] for label, r, key in rows]
    best = tuple(1 + columns.index(c) for c in ("after", "gain", "half") if c in columns) if bold else ()
    table = md([first] + [COLUMNS[c][0] for c in columns], cells[:compete], best)
    return "\n".join([table] + ["| " + " | ".join(r) + " |" for r in cells[len(cells[:compete]):]])


def mc(label: str, stem: str, seeds=(0, 1, 2)) -> tuple[str, Run, str]:
    return label, run(MC, stem, seeds), f"{MC}/{stem}"


def seed_table(columns: list[tuple[str, str, object]], seeds: tuple[int, ...], minus: int | None = None) -> str:
    """One row per seed: each column is a run's held-out reward at a point (``"before"``, ``"half"``: the last
    validation by half, ``"after_half"``: the first after it, ``"end"``, or the n-th validation); then their mean
    and, with ``minus``, each column minus that one, mean +- standard error over the seeds."""
    header, values = ["seed"], []
    for label, stem, point in columns:
        r = run(MC, stem, seeds)
        picked = [s.at(point) for s in r]
        xs = {round(x) for x, _ in picked}
        if len(xs) != 1:
            raise SystemExit(f"{stem}: the seeds validated at different evaluations {sorted(xs)}")
        x = xs.pop()
        where = {"end": "the end", "half": f"{100 * x / r[0].total:.1f} %, the last by half"}.get(
            point, f"{100 * x / r[0].total:.1f} %")
        header.append(label if point == "before" else f"{label} at {x:,} ({where})".strip())
        values.append([y for _, y in picked])
    rows = [[str(s)] + [f"{v[i]:.3f}" for v in values] for i, s in enumerate(seeds)]
    rows.append([f"mean of {len(seeds)}"] + [f"{statistics.fmean(v):.3f}" for v in values])
    if minus is not None:
        diffs = [[a - b for a, b in zip(v, values[minus])] for v in values]
        rows.append([f"minus {header[1 + minus].split(' (')[0]}, mean +- standard error"] + [
            "" if i == minus or columns[i][2] == "before" else
            f"{statistics.fmean(d):+.3f} +- {statistics.stdev(d) / len(d) ** 0.5:.3f} "
            f"({sum(x >= 0 for x in d)} of {len(d)} seeds >= 0)" for i, d in enumerate(diffs)])
    return md(header, rows)


def quickstart() -> str:
    """The kept quickstart seeds (``docs/data/quickstart/``) beside the same three seeds at the earlier settings: the
    260-batch ones on the 4-block guidance-distilled base (``docs/data/quickstart_gd260/``), the 90-batch ones on the
    CFG base (``docs/data/quickstart_cfg90/``), and before those (``docs/data/quickstart_before/``:
    300 batches, ``cfg_gradient: cond``, the SDE on every step) and with ``cfg_gradient: both``
    (``docs/data/quickstart_cfg_both/``)."""
    seeds = lambda q: [load(q / f, s) for s, f in enumerate(("metrics.csv", "metrics_seed1.csv",  # noqa: E731
                                                               "metrics_seed2.csv"))]
    r, gd260, cfg90, before, both = (seeds(DATA / q) for q in ("quickstart", "quickstart_gd260", "quickstart_cfg90",
                                                               "quickstart_before", "quickstart_cfg_both"))
    b, a = [s.before for s in r], [s.after for s in r]
    first, last = (statistics.fmean(e) for e in zip(*map(eighths, r)))
    f3 = lambda v: " / ".join(f"{x:.3f}" for x in v)  # noqa: E731

    def earlier(label: str, runs: list) -> list[str]:
        bb, ab = [s.before for s in runs], [s.after for s in runs]
        return [f"{label} ({len(runs[0].train)} batches), seeds 0 / 1 / 2; mean", f"{f3(bb)}; {pr.mean_std(bb)}",
                f"{f3(ab)}; {pr.mean_std(ab)}", " / ".join(share(x, y) for x, y in zip(bb, ab)) + "; "
                + share(statistics.fmean(bb), statistics.fmean(ab))]

    return md(["measured on this dev box (2 CPU cores)", "base model", f"after {len(r[0].train)} batches",
               f"share of the headroom to {CEILING}"], [
        ["validation alignment, 128 validation prompts x 4 seeds (what the run prints), seed 0 (the default)",
         f3(b[:1]), f3(a[:1]), share(b[0], a[0])],
        ["the same, seed 1 / seed 2", f3(b[1:]), f3(a[1:]), " / ".join(share(x, y) for x, y in zip(b[1:], a[1:]))],
        ["the same, mean of seeds 0-2 (+- std)", pr.mean_std(b), f"**{pr.mean_std(a)}**",
         f"**{share(statistics.fmean(b), statistics.fmean(a))}**"],
        ["training reward (the training rollouts' samples of the training prompts, first / last eighth, mean of "
         "seeds 0-2)",
         f3([first]), f3([last]), share(first, last)],
        earlier("the 6-minute settings before (`flowrl/tiny-digits-gd`, 4 blocks, 16 prompts x 8, no EMA)", gd260),
        earlier("the 5-minute settings on the CFG base before (`flowrl/tiny-digits`, CFG 4.5, the full ODE tail, "
                "lr 6e-4)", cfg90),
        earlier("the settings before (SDE on every step, first 3 trained, `cfg_gradient: cond`, lr 4e-4)", before),
        earlier("the same with `cfg_gradient: both`", both)])


SWEEP = [  # (the change, its runs in runs.csv): every run of the sweep, the single changes first
    ("none (LoRA r16, lr 3e-4, noise 0.7, first 5 of 10 steps, 16 prompts x 8)", ["base"]),
    ("`num_minibatches: 2` (same samples, two optimizer steps per batch)", ["mb2"]),
    ("LoRA r32, lr 4e-4", ["r32lr4"]), ("LoRA r32, lr 5e-4", ["r32lr5"]),
    ("KL beta 0.01, LoRA r32, lr 7e-4", ["kl01"]), ("8 prompts x 16 samples, lr 5e-4", ["g16"]),
    ("full fine-tuning, lr 3e-5 / 1e-5", ["full3e5", "full1e5"]),
    ("240 batches instead of 160 (over the budget)", ["base240"]),
    ("all 10 steps trained / first 7 (with r32, lr 5e-4)", ["tf10", "r32lr5tf7"]),
    ("noise level 0.3 / 0.4 / 0.5", ["n03", "n04", "n05"]), ("CPS step", ["cps"]),
    ("32 prompts x 4 samples, LoRA r32, lr 5e-4", ["g4"]),
    ("`num_minibatches: 2` and clip 1e-3 / LoRA r32 / LoRA r32, lr 5e-4", ["mb2clip3", "mb2r32", "mb2r32lr5"]),
    ("noise 0.5 and `num_minibatches: 2` / LoRA r32, lr 5e-4", ["n05mb2", "n05r32lr5"]),
    ("LoRA r32, lr 5e-4, Adam beta2 0.99", ["r32lr5b99"]),
]


def sweep() -> str:
    """The H100 sweep (``docs/data/quickstart_sweep/runs.csv``): per change, the mean over its seeds."""
    with open(DATA / "quickstart_sweep" / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    left = {r["run"] for r in rows} - {n for _, names in SWEEP for n in names}
    if left:
        raise SystemExit(f"runs.csv holds runs the sweep table leaves out: {sorted(left)}")
    mean = lambda name, key: statistics.fmean(  # noqa: E731
        float(r[key].split(" -> ")[0]) for r in rows if r["run"] == name)
    cells = []
    for change, names in SWEEP:
        per = [(sum(r["run"] == n for r in rows), mean(n, "val256_before_after"), mean(n, "train_last_eighth"),
                mean(n, "val256_last")) for n in names]
        cells.append([change] + [" / ".join(f"{p[i]}" if i == 0 else f"{p[i]:.3f}" for p in per) for i in range(4)]
                     + [" / ".join(share(p[1], p[3]) for p in per)])
    return md(["change to the quickstart of that time", "seeds", "held-out before", "training reward, last eighth",
               "held-out alignment after", f"share of the headroom to {CEILING}"], cells)


DENSE = [("Flow-GRPO", "flow_grpo"), ("DenseGRPO", "dense_grpo"), ("TP-GRPO (CPS, clip 1e-5)", "tp_grpo")]


def dense_methods() -> str:
    cells = []
    for label, stem in DENSE:
        r = run("dense_methods", stem)
        first, last = zip(*map(eighths, r))
        cells.append([label, f"{statistics.fmean(s.nfe for s in r):,.0f}", f"{len(r[0].train)}",
                      pr.mean_std(first), pr.mean_std(last), signed([b - a for a, b in zip(first, last)]),
                      pr.mean_std([s.before for s in r]), pr.mean_std([s.after for s in r]),
                      signed([s.after - s.before for s in r]),
                      f"{recorded('wall_minutes', f'dense_methods/{stem}')} min"])
    return md(["method (mean +- std over 3 seeds)", "NFE per trajectory", "batches", "training reward, first eighth",
               "last eighth", "gain", "validation alignment before", "after", "gain", "wall time (shared H100)"],
              cells, bold=(4, 7))


def dense_per_step() -> str:
    """Training reward per batch (one optimizer step each): the dense runs' first 3 and last 5 of their 25."""
    return md(["method (mean of 3 seeds)", "training reward, batches 1-3", "batches 21-25"], [
        [label] + [f"{statistics.fmean(statistics.fmean(s.train[a:b]) for s in run('dense_methods', stem)):.3f}"
                   for a, b in ((0, 3), (20, 25))] for label, stem in DENSE])


def dense_seeds() -> str:
    runs = [run("dense_methods", stem) for _, stem in DENSE]
    header = ["seed", "validation before (all three)"]
    for label, _ in DENSE:
        header += [f"{label.split(' (')[0]}: training reward, last eighth", "validation after"]
    return md(header, [[str(i), f"{runs[0][i].before:.3f}"] + [
        f"{v:.3f}" for r in runs for v in (eighths(r[i])[1], r[i].after)] for i in range(3)])


def blocks() -> dict[str, str]:
    """Every block of the page, in page order."""
    late, tf1 = "tree_rpo_late_window", "tempflow_grpo_1step"
    six = (0, 1, 2, 3, 4, 5)
    return {
        "quickstart": quickstart(),
        "quickstart-evaluated": quickstart_evaluated(),
        "hacking-demo": hacking_demo(),
        "sweep": sweep(),
        "dense-methods": dense_methods(),
        "dense-seeds": dense_seeds(),
        "dense-per-step": dense_per_step(),
        "by-half": f"**Gain by half**, in every table on this page: {pr.HALF_RULE}.",
        "methods-papers": method_table("method (mean +- std over 3 seeds)", [
            mc("Flow-GRPO", "flow_grpo"), mc("DenseGRPO", "dense_grpo"), mc("TP-GRPO", "tp_grpo"),
            mc("TempFlow-GRPO", "tempflow_grpo"), mc("Dynamic-TreeRPO", "tree_rpo"),
            mc("BranchGRPO", "branch_grpo")], ["batches", "cost", "transition", "after", "gain", "half", "minutes"]),
        "methods-levers": method_table("run (mean +- std over seeds 0-2)", [
            mc("Flow-GRPO", "flow_grpo"), mc("DenseGRPO, reused v", "dense_grpo_reused_v"),
            mc("TP-GRPO, reused v", "tp_grpo_reused_v"), mc("TempFlow-GRPO, 1-step completions", tf1),
            mc("Dynamic-TreeRPO, late window", late)],
            ["batches", "cost", "transition", "after", "gain", "half", "minutes"]),
        "half-seeds": seed_table([("held-out before", "flow_grpo", "before"), ("Flow-GRPO", "flow_grpo", "end"),
                                  ("Dynamic-TreeRPO late window", late, "half"), ("", late, "end"),
                                  ("TempFlow-GRPO 1-step", tf1, "half"), ("", tf1, "after_half"), ("", tf1, "end")],
                                 six, minus=1),
        "layer-tuning": method_table("run (mean +- std over 3 seeds)", [
            mc("Dynamic-TreeRPO, late window", late), mc("the same with `layer_tuning: 0.5`", late + "_layer_tuning"),
            mc("the same with `layer_tuning: 2.0`", late + "_layer_tuning2")], ["batches", "after", "gain", "half"],
            bold=False),
        "few-step": method_table("run (mean +- std over 3 seeds)", [
            mc("Flow-GRPO, 10-step teacher with CFG", "flow_grpo"), mc("Flow-GRPO, 4-step base", "flow_grpo_4step"),
            mc("TDM-R1, 4-step base", "tdm_r1"), mc("DiffusionNFT, CFG-free", "diffusion_nft"),
            mc(f"Flow-GRPO, 4-step base, {run(MC, 'flow_grpo_4step_128k')[0].total:,.0f} evaluations",
               "flow_grpo_4step_128k")], ["per_sample", "batches", "before", "after", "gain", "half", "minutes"],
            compete=4),
        "four-step-seeds": seed_table([("held-out before", "flow_grpo_4step", "before")] + [
            ("Flow-GRPO 4-step" if i == 1 else "", "flow_grpo_4step", i) for i in range(1, 5)] + [
            ("", "flow_grpo_4step", "end"), ("its longer run", "flow_grpo_4step_128k", "end"),
            ("TDM-R1", "tdm_r1", "end")], (0, 1, 2)),
        **methods_2026(),
        **one_budget_blocks(),
    }


#: The 2026 objectives beside the methods they change, every run at one commit (``scripts/compare_methods.py --budget
#: 32000 --prompts 4 --seeds 0 1 2 --jobs 2 --methods Flow-GRPO Flow-DPPO GRPO-Guard AWM DiffusionNFT --drift``,
#: 2026-11-28, the 2-core dev box shared with other work): Flow-DPPO and GRPO-Guard against Flow-GRPO from the same CFG
#: start, AWM against DiffusionNFT from the same CFG-free one, at the same budget and batch shape. Flow-GRPO's and
#: DiffusionNFT's runs of the tables above are older (2026-11-23): the code has changed since (Flow-GRPO's
#: ``cfg_gradient`` default among it), so their reruns at this commit are kept apart (``*_2026_seed<k>.csv``).
METHODS_2026 = [("Flow-GRPO", "flow_grpo_2026"), ("Flow-DPPO, loss dppo", "dppo"),
                ("GRPO-Guard, loss grpo_guard", "grpo_guard"), ("DiffusionNFT, CFG-free", "diffusion_nft_2026"),
                ("AWM, CFG-free", "awm")]
DRIFT_2026 = DATA / MC / "drift_2026.csv"  # the --drift of the same runs (scripts/base_drift.py)


def methods_2026() -> dict[str, str]:
    """The 2026 objectives' table (bold within each start: the first three from CFG, the last two CFG-free), per
    seed each one's final held-out reward against the method it changes, and how far each drifted from its base."""
    rows = [mc(label, stem) for label, stem in METHODS_2026]
    columns = ["batches", "cost", "transition", "before", "after", "gain", "half"]
    cfg_free = method_table("", rows[3:], columns).splitlines()[2:]
    return {
        "methods-2026": method_table("method (mean +- std over 3 seeds)", rows[:3], columns) + "\n" +
        "\n".join(cfg_free),
        "methods-2026-seeds": seed_table([("held-out before", "flow_grpo_2026", "before"),
                                          ("Flow-GRPO", "flow_grpo_2026", "end"), ("Flow-DPPO", "dppo", "end"),
                                          ("GRPO-Guard", "grpo_guard", "end")], (0, 1, 2), minus=1),
        "methods-2026-cfg-free-seeds": seed_table([("held-out before, CFG-free", "diffusion_nft_2026", "before"),
                                                   ("DiffusionNFT", "diffusion_nft_2026", "end"), ("AWM", "awm", "end")],
                                                  (0, 1, 2), minus=1),
        "methods-2026-drift": drift_2026(rows),
    }


def drift_2026(rows: list[tuple[str, Run, str]]) -> str:
    """Per method, the KL of its final policy's SDE trajectories to its base model's and the velocity MSE to it
    (``scripts/base_drift.py``), per seed and mean +- std, beside the held-out gain the same runs bought."""
    with open(DRIFT_2026, newline="") as f:
        kept = list(csv.DictReader(f))
    cells = []
    for (label, r, _), (name, _) in zip(rows, METHODS_2026):
        method = label.split(",")[0]
        mine = sorted((int(k["seed"]), float(k["kl"]), float(k["velocity_mse"])) for k in kept if k["method"] == method)
        if [s for s, _, _ in mine] != [s.seed for s in r]:
            raise SystemExit(f"{DRIFT_2026.name}: {method} has seeds {[s for s, _, _ in mine]}, its runs {name}")
        kls, mses = [kl for _, kl, _ in mine], [m for _, _, m in mine]
        cells.append([label, " / ".join(f"{kl:.3f}" for kl in kls), pr.mean_std(kls), f"{statistics.fmean(mses):.4f}",
                      signed([s.after - s.before for s in r])])
    return md(["method", "KL to the base at the end, seeds 0 / 1 / 2", "KL, mean +- std",
               "velocity MSE to the base, mean", "held-out gain (the same runs)"], cells)


BLOCK = re.compile(r"<!-- results:(\S+) -->\n\n(.*?)\n\n<!-- /results:\1 -->", re.S)
UNKEPT = re.compile(r"<!-- unkept -->.*?<!-- /unkept -->", re.S)
PAIR = r"[+-]?\d+\.\d{3} \+- \d+\.\d{3}"  # a mean and its spread are quoted together or not at all
# what prose may quote only from a table: a figure with 2 or 3 decimals, minutes, a percentage, a count with a
# thousands comma, a count of batches (settings in inline code and one-decimal constants are not figures)
FIGURE = re.compile(PAIR + r"|(?<![\d.])[+-]?\d+\.\d{2,3}(?![\d.])|\d+\.\d(?= min)|\d+(?:\.\d+)? ?%"
                    r"|\d{1,3}(?:,\d{3})+(?!\d)|\d+(?= batches)")
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?")


def wrap(name: str, text: str) -> str:
    return f"<!-- results:{name} -->\n\n{text}\n\n<!-- /results:{name} -->"


def figures(text: str, *patterns: str | re.Pattern) -> set[str]:
    """The numbers in ``text`` (each ``mean +- spread`` also as one), their ``+`` sign, ``%`` and spaces before it
    dropped."""
    return {m.lstrip("+").rstrip("%").rstrip() for p in patterns or (NUMBER, PAIR) for m in re.findall(p, text)}


def problems(page: str, made: dict[str, str]) -> list[str]:
    """What on ``page`` differs from the blocks ``made``, and the figures its prose quotes that no block of their
    section (the ``##`` heading they stand under; the whole page for the lines above the first) holds."""
    held = dict(BLOCK.findall(page))
    out = [f"block {n!r}: {'missing from the page' if n not in held else 'not what the script prints'}"
           for n in made if held.get(n) != made[n]]
    out += [f"block {n!r} on the page is not one the script prints" for n in held if n not in made]
    sections = re.split(r"\n(?=## )", page)
    for i, section in enumerate(sections):
        numbers = figures("\n".join(made.get(n, "") for n, _ in BLOCK.findall(page if i == 0 else section)))
        prose = re.sub(r"```.*?```|`[^`]*`", "", UNKEPT.sub("", BLOCK.sub("", section)), flags=re.S)
        out += [f"the prose quotes {f!r} under {section.splitlines()[0]!r}, which none of its tables holds"
                for f in sorted(figures(prose, FIGURE) - numbers)]
    return out


def main(write: bool = False) -> None:
    made = blocks()
    if not write:
        print("\n\n".join(wrap(n, t) for n, t in made.items()))
        return
    page = PAGE.read_text()
    missing = [n for n in made if f"<!-- results:{n} -->" not in page]
    if missing:
        raise SystemExit(f"docs/results.md has no place for {missing}: add '<!-- results:NAME -->' and its end")
    PAGE.write_text(BLOCK.sub(lambda m: wrap(m[1], made.get(m[1], m[2])), page))
    print(f"wrote {PAGE}")
