"""scripts/bench_fsdp2_memory.py on a small denoiser: one row per process of each load, and under FSDP2 each of the 2
ranks holds half of the denoiser; the memory figures themselves are for the docs (Scaling out), not tests."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # five fresh processes
def test_each_load_is_measured_per_process():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/bench_fsdp2_memory.py"), "--layers", "2", "--heads", "4",
                          "--head-dim", "32"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=600,
                         check=True).stdout
    rows = re.findall(r"^(1 process|FSDP2 x2, every rank reads|FSDP2 x2, rank 0 reads) +(\d) +\d+ +(\d+)", out, re.M)
    assert [(name, rank) for name, rank, _ in rows] == [("1 process", "0"), *[
        (f"FSDP2 x2, {mode}", r) for mode in ("every rank reads", "rank 0 reads") for r in "01"]]
    whole = int(rows[0][2])
    assert all(abs(int(held) - whole / 2) <= 1 for _, _, held in rows[1:])  # MB, rounded: half each
