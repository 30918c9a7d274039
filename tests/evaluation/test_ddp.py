"""``evaluate`` on 2 DDP processes writes the files 1 process writes: batches are the same whole prompts on any
number of ranks, each rank draws and scores its own, and rank zero gathers and writes. A real ``python -m flowrl
evaluate`` subprocess (Lightning starts the second rank), with a timeout so that a hang fails."""

import os
import subprocess
import sys

import pytest

from tests.evaluation.conftest import ROOT, evaluate_args

# one xdist worker runs this file (pytest's --dist loadgroup): the session's brightness fit and evaluation
# (tests/evaluation/conftest.py) is built once, not once per worker
pytestmark = pytest.mark.xdist_group("evaluation")


def test_two_processes_write_the_files_of_one(evaluated, bright_ckpt, untrained_lora, suite16, tmp_path):
    one, _ = evaluated
    two = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowrl", *evaluate_args(bright_ckpt, untrained_lora, suite16, two),
                             "--devices", "2", "--strategy", "ddp"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"2-process evaluate did not finish in 400 s (a hang?):\n{proc.communicate()[0][-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    assert out.count("report:") == 1  # rank zero alone writes and prints
    for name in ("scores.csv", "diversity.csv", "summary.csv"):
        assert (two / name).read_text() == (one / name).read_text(), name
    # each rank wrote its own rows' images into rank zero's folder
    assert sorted(p.name for p in (two / "images" / "bright").iterdir()) == sorted(
        p.name for p in (one / "images" / "bright").iterdir())
    assert len(list((two / "images" / "bright").iterdir())) == 32
