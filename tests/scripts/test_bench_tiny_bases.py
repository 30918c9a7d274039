"""``scripts/bench_tiny_bases.py``: one row per base, the first base the unit of the ratios."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_tiny_bases  # noqa: E402


def test_each_base_is_timed_against_the_first(capsys):
    rows = bench_tiny_bases.main(["--models", "flowrl/tiny-digits-gd", "flowrl/tiny-digits-gd3", "--rows", "4",
                                  "--repeats", "1"])
    assert [r["model"] for r in rows] == ["flowrl/tiny-digits-gd", "flowrl/tiny-digits-gd3"]
    assert rows[0]["no_grad_ratio"] == rows[0]["train_ratio"] == 1.0
    assert all(r["no_grad_s"] > 0 and r["train_s"] > 0 for r in rows)
    assert rows[1]["no_grad_ratio"] == rows[1]["no_grad_s"] / rows[0]["no_grad_s"]
    assert "flowrl/tiny-digits-gd3: no-gradient call" in capsys.readouterr().out
