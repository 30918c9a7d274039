"""Each tiny config's quick try, as Getting started documents it, timed one after another.

    python scripts/bench_quick_tries.py                                  # every configs/tiny_*.yaml
    python scripts/bench_quick_tries.py --configs tiny_dense_grpo tiny_flow_grpo

A quick try is ``python -m flowrl fit --config configs/<tiny>.yaml`` with :data:`QUICK` and the config's row of
:data:`EXTRA` (the options a method needs beside them to stay short), in a temporary ``--trainer.default_root_dir``,
with ``OMP_NUM_THREADS=1``. The table gives per config the batches the run trained, the model evaluations its
training batches logged (``rollout/evaluations``, DenseGRPO's calibration included; the validations' are not), the
child's CPU seconds (user + sys, from ``resource.getrusage(RUSAGE_CHILDREN)`` before and after) and its wall
seconds; the load average is printed at the start and at the end. CPU seconds are the figure to compare: wall
seconds on a shared machine measure the others' load as much as the run. Runs one fit at a time, never two.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
#: every quick try's options: 4 optimizer steps, validation on the first 8 prompts (before and after)
QUICK = ("--trainer.max_steps=4", "--data.val_limit=8")
#: what a method adds to QUICK to stay short (Getting started and the configs' headers quote these rows):
#: DenseGRPO's first batch calibrates its noise on 32 x 5 whole trajectories (10,400 model evaluations) unless shrunk
EXTRA: dict[str, tuple[str, ...]] = {
    "tiny_dense_grpo": ("--model.init_args.calibration.samples=8", "--model.init_args.calibration.iterations=1"),
}

#: runs a command line with an environment; returns its exit status and its output
Runner = Callable[[list[str], dict[str, str]], tuple[int, str]]


def tiny_configs() -> list[str]:
    """The names of every ``configs/tiny_*.yaml``, sorted."""
    return sorted(p.stem for p in (ROOT / "configs").glob("tiny_*.yaml"))


def quick_options(name: str) -> list[str]:
    """The documented quick-try options of tiny config ``name``: :data:`QUICK` and its row of :data:`EXTRA`."""
    return [*QUICK, *EXTRA.get(name, ())]


def command(name: str, root: str) -> list[str]:
    """The quick try of ``configs/<name>.yaml`` logging into ``root``."""
    return [sys.executable, "-m", "flowrl", "fit", "--config", f"configs/{name}.yaml", *quick_options(name),
            f"--trainer.default_root_dir={root}"]


def subprocess_runner(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Runs ``cmd`` from the repository root; its exit status and its output (stdout and stderr)."""
    done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def logged(root: Path) -> tuple[int, float | None]:
    """The training batches a run under ``root`` logged and the model evaluations they logged (None if none did)."""
    batches, evaluations = 0, None
    for path in root.rglob("metrics.csv"):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("rollout/evaluations"):
                    batches += 1
                    evaluations = (evaluations or 0.0) + float(row["rollout/evaluations"])
    return batches, evaluations


def cpu_seconds() -> float:
    """User + sys CPU seconds of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(name: str, runner: Runner = subprocess_runner) -> dict:
    """One quick try of ``configs/<name>.yaml``: its row of the table (``config``, ``status``, ``batches``,
    ``evaluations``, ``cpu_s``, ``wall_s``) and its output's last lines when it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix=f"quick_{name}_") as root:
        cpu, wall = cpu_seconds(), time.perf_counter()
        status, output = runner(command(name, root), env)
        cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
        batches, evaluations = logged(Path(root))
    row = {"config": name, "status": status, "batches": batches, "evaluations": evaluations,
           "cpu_s": cpu, "wall_s": wall}
    if status:
        row["tail"] = "\n".join(output.splitlines()[-15:])
    return row


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| config | status | batches | model evaluations (training) | CPU s | wall s |", "|---|---|---|---|---|---|"]
    for r in rows:
        evaluations = "-" if r["evaluations"] is None else f"{r['evaluations']:,.0f}"
        lines.append(f"| {r['config']} | {'ok' if r['status'] == 0 else 'failed'} | {r['batches']} | {evaluations} "
                     f"| {r['cpu_s']:.0f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, runner: Runner = subprocess_runner) -> list[dict]:
    """Runs the chosen quick tries one at a time and prints each row as it ends, then the table; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", choices=tiny_configs(), default=tiny_configs(), metavar="NAME",
                        help="tiny configs to try (default: every configs/tiny_*.yaml)")
    args = parser.parse_args(argv)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for name in args.configs:
        rows.append(measure(name, runner))
        r = rows[-1]
        print(f"{name}: status {r['status']}, {r['batches']} batches, {r['evaluations']} evaluations, "
              f"{r['cpu_s']:.1f} CPU s, {r['wall_s']:.1f} wall s, load {os.getloadavg()[0]:.2f}", flush=True)
        if r["status"]:
            print(r["tail"], flush=True)
    print(table(rows))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return rows


if __name__ == "__main__":
    main()
