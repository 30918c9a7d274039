"""Every shipped tiny config runs on 2 DDP processes (the default run: tiny_flow_grpo, as 2 nodes x 1 process on
localhost) to the end, and prints the validation and training numbers of a 1-process run: the sample grids and the
run summary take part in every collective, the validation mean is reduced over the ranks, and the minibatches are
drawn over the whole batch. Each run is a process of its own with a timeout, so a hang fails instead of stalling:
a launched ``python -m flowrl fit``, or a node forked from pytest's process (``tests/forked_command.py``)."""

import csv
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.cli import main
from tests.forked_command import ForkedCommand
from tests.rewards.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--trainer.max_steps=2", "--data.val_prompts=[red 3 and blue 7, green 1 and red 2, blue 4 and blue 5]",
         "--trainer.accelerator=cpu"]
CONFIGS = {  # shrunk for CI (fewer steps, one calibration iteration); every other setting is the shipped one
    "quickstart.yaml": ["--data.num_groups=4"],
    "tiny_flow_grpo.yaml": ["--model.init_args.num_steps=4"],
    "tiny_dense_grpo.yaml": ["--model.init_args.num_steps=4", "--model.init_args.calibration.iterations=1",
                             "--model.init_args.calibration.samples=8"],
    "tiny_tp_grpo.yaml": ["--model.init_args.num_steps=4", "--model.init_args.window_size=3"],
    "tiny_tempflow_grpo.yaml": ["--model.init_args.num_steps=4", "--model.init_args.branches=3",
                                "--data.num_groups=2"],
    "tiny_tree_rpo.yaml": ["--model.init_args.num_steps=4", "--model.init_args.window_size=2", "--data.num_groups=2"],
    "tiny_branch_grpo.yaml": ["--model.init_args.num_steps=4", "--model.init_args.split_steps=[0, 2]",
                              "--data.num_groups=2"],
}


def args(config: str, out: Path, *extra: str) -> list[str]:
    return ["fit", "--config", f"configs/{config}", *SMALL, *CONFIGS[config], f"--trainer.default_root_dir={out}",
            *extra]


def fit(config: str, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "flowrl", *args(config, out, *extra)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def numbers(out: str) -> dict[str, str]:
    """The run summary's printed numbers."""
    found = dict(re.findall(r"^  ((?:val|train reward)[^:]*): (.+)$", out, flags=re.M))
    assert {"val digit_alignment", "val total", "train reward/total (as logged)"} <= set(found), out[-2000:]
    return found


def one_process(config: str, out: Path, capsys, monkeypatch) -> dict[str, str]:
    """The 1-process reference, run in this process (no start-up cost)."""
    monkeypatch.chdir(ROOT)
    main(args(config, out, "--trainer.enable_progress_bar=false"))
    return numbers(capsys.readouterr().out)


def finish(proc: subprocess.Popen, timeout: int = 300) -> str:
    """The output of a run that ended with status 0 within ``timeout`` seconds."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the run did not finish in {timeout} s (a hang?):\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    return out


def summary(proc: subprocess.Popen) -> dict[str, str]:
    return numbers(finish(proc))


def two_nodes(config: str, out: Path, strategy: str) -> list[ForkedCommand]:
    """Two nodes of one process each on localhost, from the cluster variables a SLURM or torchrun launch sets: each
    a fork of this process (``tests/forked_command.py``), its output in ``out/node<rank>.log``."""
    port = str(free_port())
    out.mkdir(parents=True, exist_ok=True)
    return [ForkedCommand(args(config, out, "--trainer.num_nodes=2", "--trainer.devices=1",
                               f"--trainer.strategy={strategy}"),
                          {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(rank), "WORLD_SIZE": "2"},
                          out / f"node{rank}.log")
            for rank in (0, 1)]


#: what each process measures of its own (wall-clock throughput): the only logged columns a 2-process run may differ in
PER_PROCESS = {"rollout/samples_per_s"}


def logged(out: Path) -> dict[tuple[str, str], float]:
    """``{(step, column): value}`` of every train/ and rollout/ value in the run's metrics.csv."""
    (metrics,) = out.glob("*/version_0/metrics.csv")
    with metrics.open() as f:
        return {(row["step"], key): float(value) for row in csv.DictReader(f) for key, value in row.items()
                if key.startswith(("train/", "rollout/")) and key not in PER_PROCESS and value != ""}


def assert_same_metrics(one: Path, two: Path) -> None:
    """metrics.csv of the 2-process run holds the 1-process run's values: global, not rank zero's own."""
    first, second = logged(one), logged(two)
    assert first.keys() == second.keys()
    differ = {k: (first[k], second[k]) for k in first if not math.isclose(first[k], second[k], rel_tol=1e-4,
                                                                            abs_tol=1e-5)}
    assert not differ, differ


# slow: the methods' 2 DDP processes are compared with 1 per sample in tests/methods/test_two_ranks_equal_one.py
# (Lightning starting the second rank: every fit of the suite's process group, tests/two_process_group.py); the
# tiny_flow_grpo config's 2 DDP processes run to the end in the default suite as 2 nodes (below), which checks what
# this test does (the printed numbers, the metrics, the grids and checkpoint in rank zero's folder)
@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_two_ddp_processes_print_the_numbers_of_one(config, tmp_path, capsys, monkeypatch):
    one = one_process(config, tmp_path / "one", capsys, monkeypatch)
    two = summary(fit(config, tmp_path / "two", "--trainer.devices=2", "--trainer.strategy=ddp"))
    assert two == one
    assert_written_by_rank_zero(tmp_path / "one", tmp_path / "two")


def assert_written_by_rank_zero(one: Path, two: Path) -> None:
    """The 2-process run's metrics.csv holds the 1-process run's values, and rank zero wrote the grid and the
    checkpoint into the run's one folder."""
    assert_same_metrics(one, two)
    (folder,) = two.glob("*/version_0")
    assert list((folder / "samples").glob("step_*.png")) and (folder / "checkpoints" / "last.ckpt").is_file()


def test_two_nodes_of_one_process_on_localhost_equal_one_process(tmp_path, capsys, monkeypatch):
    config = "tiny_flow_grpo.yaml"
    one = one_process(config, tmp_path / "one", capsys, monkeypatch)
    nodes = two_nodes(config, tmp_path / "nodes", "ddp")
    first = summary(nodes[0])
    assert "run summary" not in finish(nodes[1])  # the second node ends too; only global rank zero prints
    assert first == one
    assert_written_by_rank_zero(tmp_path / "one", tmp_path / "nodes")
    runs = sorted(p.name for p in (tmp_path / "nodes" / "tiny_flow_grpo").iterdir())
    assert runs == ["latest", "version_0"]  # no stray version from the second node
