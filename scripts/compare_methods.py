"""Every method on the embedded task at one budget of model evaluations, several seeds, one plot and one table.

    OMP_NUM_THREADS=1 python scripts/compare_methods.py --budget 120000 --seeds 0 1 2 --jobs 2 --out runs/compare
    python scripts/compare_methods.py --budget 120000 --seeds 0 1 2 --out runs/compare --plot-only

Each method trains from its tiny config (``configs/tiny_<method>.yaml``: T=10, its published shape and numerics) on
the 772 training prompts outside the validation set, ``--prompts`` prompts per batch (8 samples each for Flow-GRPO,
DenseGRPO and TP-GRPO; one tree each for the tree methods), until it has spent ``--budget`` model evaluations
(``rollout/evaluations``, a CFG pair counted once, completions, shared prefixes and DenseGRPO's calibration
included; ``flowrl.callbacks.EvaluationBudget`` stops the run at the batch that reaches it, as a method's cost per
batch may change, e.g. Dynamic-TreeRPO's moving window): a two-batch probe measures each method's evaluations per
batch, which sets its validation interval. ``--variant`` adds runs of a method with overrides (the levers that cut
the cost of dense credit). Rerunning the same command after an interruption keeps every run that already spent the
budget and restarts the others. Validation: the 128 held-out prompts of ``configs/prompts/digits_val.txt`` with the
10-step ODE, before the first batch, at ``--val-every`` batches' worth of budget and after the last. The runs'
``metrics.csv`` files go under ``--out/<method>/seed<k>/``. ``--drift`` measures each run's final policy against
its base model on the held-out prompts (``scripts/base_drift.py``: the KL of the Flow-GRPO SDE's trajectories and
the velocity MSE), into ``drift.json`` beside each run and ``--out/drift.csv``. ``--kept DIR`` keeps the
comparison's data across commits: a run whose ``metrics.csv`` is kept there (``DIR/<config without tiny_>[_<tag>]
_seed<k>.csv``, ``--tag``) is first rerun for its first ``--check-batches`` batches; if they reproduce the kept rows
bit for bit (``scripts/compare_metrics.py``'s rule) the kept file stands for the run, else the run is made in full and
its file replaces the kept one (a fresh run's file is kept there too). The plot (training reward and validation against
cumulative evaluations, mean and min-max band over seeds) and a Markdown table come from ``scripts/plot_rewards.py``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compare_metrics import differences, read  # this script's folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"Flow-GRPO": "tiny_flow_grpo", "DenseGRPO": "tiny_dense_grpo", "TP-GRPO": "tiny_tp_grpo",
           "TempFlow-GRPO": "tiny_tempflow_grpo", "Dynamic-TreeRPO": "tiny_tree_rpo", "BranchGRPO": "tiny_branch_grpo",
           "TDM-R1": "tiny_tdm_r1", "DiffusionNFT": "tiny_diffusion_nft", "Flow-DPPO": "tiny_dppo",
           "GRPO-Guard": "tiny_grpo_guard", "AWM": "tiny_awm", "MixGRPO": "tiny_mix_grpo", "G2RPO": "tiny_g2rpo",
           "GCPO": "tiny_gcpo", "Flash-GRPO": "tiny_flash_grpo", "Step gain": "tiny_step_gain"}
#: Flow-GRPO and every step-credit method (dense, tree, the 2026 step-credit ones, the one-step gain), compared by
#: default; the others on request: --methods, e.g. the 2026 objectives ``--methods Flow-GRPO Flow-DPPO GRPO-Guard AWM
#: DiffusionNFT``
POLICY_GRADIENT = [*list(METHODS)[:6], "MixGRPO", "G2RPO", "GCPO", "Flash-GRPO", "Step gain"]


def fit_arguments(config: str, out: Path, seed: int, prompts: int, max_steps: int, extra: list[str]) -> list[str]:
    """The arguments of ``python -m flowrl`` for one run of ``config``."""
    return ["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), f"--seed_everything={seed}",
            f"--trainer.default_root_dir={out}", f"--data.num_groups={prompts}",
            f"--data.prompts={ROOT}/configs/prompts/digits_train_large.txt", f"--trainer.max_steps={max_steps}",
            "--trainer.enable_progress_bar=false", *extra]


def fit(*run) -> subprocess.Popen:
    """One run (:func:`fit_arguments`) in a process of its own, its output discarded but for the errors."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.Popen([sys.executable, "-m", "flowrl", *fit_arguments(*run)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen, what: str) -> None:
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{err[-3000:]}")


def metrics_file(out: Path) -> Path:
    (path,) = sorted(out.glob("*/version_*/metrics.csv"))[-1:]
    return path


def spent(out: Path) -> float:
    """The model evaluations a finished or interrupted run in ``out`` spent (the sum of its batches'; 0 if none)."""
    try:
        with open(metrics_file(out)) as f:
            return sum(float(r["rollout/evaluations"]) for r in csv.DictReader(f) if r.get("rollout/evaluations"))
    except ValueError:  # no run there yet
        return 0.0


def wall_minutes(out: Path) -> float:
    """A run's wall minutes from the config it saved at the start of its fit to its last metrics (the process's
    start-up before it, seconds to minutes on a loaded machine, left out)."""
    metrics = metrics_file(out)
    return (metrics.stat().st_mtime - (metrics.parent / "config.yaml").stat().st_mtime) / 60


def evaluations_per_batch(config: str, out: Path, prompts: int, overrides: list[str]) -> float:
    """One batch of ``config`` (with ``overrides``) at this batch shape: its ``rollout/evaluations``. DenseGRPO's
    first batch also carries its calibration, so the probe takes two batches and reads the second. A rerun reads
    the probe a run of the same shape left in ``out`` (``probe.json`` says which)."""
    shape, kept = {"config": config, "prompts": prompts, "overrides": overrides}, out / "probe.json"
    if kept.is_file() and json.loads(kept.read_text())["shape"] == shape:
        return json.loads(kept.read_text())["evaluations"]
    shutil.rmtree(out, ignore_errors=True)
    finished(fit(config, out, 0, prompts, 2, ["--data.val_prompts=null", "--trainer.callbacks=[]",
                                              "--trainer.callbacks+=flowrl.rewards.DigitAlignment", *overrides]),
             f"probe of {config}")
    with open(metrics_file(out)) as f:
        evaluations = [float(r["rollout/evaluations"]) for r in csv.DictReader(f) if r.get("rollout/evaluations")][-1]
    kept.write_text(json.dumps({"shape": shape, "evaluations": evaluations}) + "\n")
    return evaluations


def kept_file(kept: Path, folder: str, tag: str, seed: int) -> Path:
    """Where the comparison keeps a run's ``metrics.csv``: ``flow_grpo_2026_seed0.csv`` for ``tiny_flow_grpo``, tag
    2026, seed 0 (a variant's folder keeps its label: ``tree_rpo__late_window_...``)."""
    name = folder.removeprefix("tiny_")
    return kept / f"{name}_{tag}_seed{seed}.csv" if tag else kept / f"{name}_seed{seed}.csv"


def kept_sources(kept: Path, folder: str, tag: str, seed: int) -> list[Path]:
    """The kept files a run may reproduce: its tagged file, else an untagged one of an earlier comparison (which the
    tagged file then copies, so earlier comparisons' files stay as they were)."""
    return [p for p in dict.fromkeys([kept_file(kept, folder, tag, seed), kept_file(kept, folder, "", seed)])
            if p.is_file()]


def training_rows(rows: list[dict]) -> list[dict]:
    """The rows of training batches (those that spent evaluations), in order: what a shorter run of the same
    command must reproduce (validations fall elsewhere in a run stopped early)."""
    return [r for r in rows if r.get("rollout/evaluations")]


def unreproduced(kept: list[dict], check: list[dict]) -> list[str]:
    """How the first batches of a check run differ from the kept run's (``compare_metrics.differences`` on the
    batches both have: the kept run's later batches are not compared); no batch to compare is a difference.

    >>> row = lambda x: {"rollout/evaluations": "320.0", "train/loss": x}
    >>> unreproduced([{"val/reward/total": "0.5"}, row("0.1"), row("0.2")], [row("0.1")])
    []
    >>> unreproduced([row("0.1"), row("0.2")], [row("0.1"), row("0.25")])
    ['row 1 train/loss: 0.2 != 0.25']
    """
    kept, check = training_rows(kept), training_rows(check)
    if not check or not kept:
        return ["no batch to compare"]
    return differences(kept[:len(check)], check[:len(kept)])


def measure_drift(out: Path, val_prompts: str) -> dict:
    """``scripts/base_drift.py`` of the finished run in ``out`` (kept in ``out/drift.json``, measured once).

    Raises:
        SystemExit: the run's last checkpoint is not its final step (its budget state differs from its metrics).
    """
    kept = out / "drift.json"
    if not kept.is_file():
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "base_drift.py"), str(out), "--prompts",
                               val_prompts], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        if proc.returncode:
            raise SystemExit(f"drift of {out} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        if measured["spent"] != spent(out):
            raise SystemExit(f"{out}: last.ckpt holds {measured['spent']} evaluations, the run spent {spent(out)}: "
                             "not the final weights")
        kept.write_text(json.dumps(measured) + "\n")
    return json.loads(kept.read_text())


def write_drift(path: Path, rows: list[dict]) -> None:
    """The drift of every run, one row per (method, seed)."""
    keys = ["method", "seed", "kl", "velocity_mse", "global_step", "spent", "ema"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120_000, help="model evaluations per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    parser.add_argument("--val-every", type=float, default=0.25, help="validate every this fraction of the budget")
    parser.add_argument("--methods", nargs="*", default=POLICY_GRADIENT, choices=list(METHODS),
                        help="methods run at their configs' settings (none: only the --variant runs)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=METHOD:OVERRIDE[,OVERRIDE]",
                        help="an extra run of METHOD with command-line overrides, e.g. "
                             "'DenseGRPO reused v=DenseGRPO:--model.init_args.completion_steps=0'")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument("--val-prompts", default=str(ROOT / "configs" / "prompts" / "digits_val.txt"),
                        help="held-out prompts (a file, or a list in YAML flow style)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--drift", action="store_true", help="measure each final policy's drift from its base model")
    parser.add_argument("--plot-only", action="store_true", help="only plot and tabulate existing runs")
    parser.add_argument("--kept", type=Path, help="folder of kept runs' metrics.csv: reused where they reproduce, "
                                                    "written for runs made anew")
    parser.add_argument("--tag", default="", help="the kept files' tag: <config>_<tag>_seed<k>.csv")
    parser.add_argument("--check-batches", type=int, default=2, help="batches rerun to check a kept run")
    args = parser.parse_args(argv)
    runs = {name: (METHODS[name], METHODS[name], []) for name in args.methods}  # label -> (config, folder, extra)
    for spec in args.variant:
        label, _, rest = spec.partition("=")
        method, _, overrides = rest.partition(":")
        if method not in METHODS:
            raise SystemExit(f"--variant {spec!r}: choose a method from {list(METHODS)}")
        folder = METHODS[method] + "__" + "".join(c if c.isalnum() else "_" for c in label.lower())
        runs[label] = (METHODS[method], folder, [o for o in overrides.split(",") if o])
    if not args.plot_only:
        jobs = []
        for name, (config, folder, overrides) in runs.items():
            per_batch = evaluations_per_batch(config, args.out / "probe" / folder, args.prompts, overrides)
            batches = max(1, math.ceil(args.budget / per_batch))
            print(f"{name}: {per_batch:.0f} evaluations per batch -> {batches} batches", flush=True)
            every = max(1, round(batches * args.val_every))
            extra = [f"--trainer.val_check_interval={every}", "--trainer.check_val_every_n_epoch=null",
                     "--data.val_batch_size=128", f"--data.val_prompts={args.val_prompts}", *overrides,
                     "--trainer.callbacks+=flowrl.callbacks.EvaluationBudget"]
            jobs += [(name, seed, config, folder, 10 * batches, extra, per_batch) for seed in args.seeds]

        def run(job):
            name, seed, config, folder, batches, extra, per_batch = job
            out, what = args.out / folder / f"seed{seed}", f"{name} seed {seed}"
            kept = kept_file(args.kept, folder, args.tag, seed) if args.kept else None

            def made(budget: float, where: Path) -> Path:  # the run stops at the budget, whatever it costs
                shutil.rmtree(where, ignore_errors=True)
                finished(fit(config, where, seed, args.prompts, batches,
                             [*extra, f"--trainer.callbacks.max_evaluations={budget}"]), what)
                return metrics_file(where)

            if spent(out) >= args.budget:  # a rerun after an interruption keeps the runs that finished
                print(f"finished before: {what}", flush=True)
            elif kept and not args.drift and (sources := kept_sources(args.kept, folder, args.tag, seed)):
                check = out.with_name(out.name + "_check")  # (the drift needs the run's own checkpoint: no reuse)
                rows = read(made(args.check_batches * per_batch, check))
                shutil.rmtree(check)
                why = {source: unreproduced(read(source), rows) for source in sources}
                if same := [source for source, differ in why.items() if not differ]:
                    shutil.rmtree(out, ignore_errors=True)
                    (out / "kept" / "version_0").mkdir(parents=True)
                    shutil.copy(same[0], out / "kept" / "version_0" / "metrics.csv")
                    print(f"reproduced: {what} ({same[0].name})", flush=True)
                else:
                    print(f"not reproduced: {what} (" + "; ".join(f"{source.name}: {differ[0]}" for source,
                          differ in why.items()) + "); rerun", flush=True)
            if spent(out) < args.budget:
                made(args.budget, out)
                print(f"done: {what}: {wall_minutes(out):.1f} wall minutes, load {os.getloadavg()[0]:.1f}",
                      flush=True)
            if kept and (not kept.is_file() or kept.read_bytes() != metrics_file(out).read_bytes()):
                shutil.copy(metrics_file(out), kept)
            if args.drift:
                measured = measure_drift(out, args.val_prompts)
                print(f"drift: {name} seed {seed}: KL {measured['kl']:.4g}", flush=True)

        # seed by seed (every method's first seed before any second one): an interrupted comparison has the most
        # methods to compare
        ordered = sorted(jobs, key=lambda job: args.seeds.index(job[1]))
        if args.jobs > 1:
            with ThreadPoolExecutor(args.jobs) as pool:
                list(pool.map(run, ordered))
        else:  # in this thread
            list(map(run, ordered))
    if args.drift:
        write_drift(args.out / "drift.csv", [{"method": name, "seed": s, **measure_drift(args.out / folder / f"seed{s}",
                                                                                        args.val_prompts)}
                                             for name, (_, folder, _) in runs.items() for s in args.seeds])
    files = [f"{name}=" + ",".join(str(metrics_file(args.out / folder / f"seed{s}")) for s in args.seeds)
             for name, (_, folder, _) in runs.items()]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_rewards.py"), *files, "--x", "evaluations",
                    "--window", "5", "--table", "--split", "--out", str(args.out / "methods.png")], check=True)


if __name__ == "__main__":
    main()
