"""scripts/bench_rollout_memory.py: both variants draw the same video rollout (the script checks their checksums) and
the table names the Wan latents of the video asked for; the memory figures themselves are for the docs, not tests."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_video_rollout_is_measured_both_ways():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/bench_rollout_memory.py"), "--batch", "2", "--steps", "3",
                          "--frames", "9", "--height", "64", "--width", "96"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, check=True).stdout
    assert "latents [16, 3, 8, 12]" in out and "same samples: checksums equal" in out
    assert {m.group(1) for m in re.finditer(r"^  (\w+) +peak above start", out, re.M)} == {"upfront", "stream"}
