"""scripts/compare_metrics.py: equal runs pass, a changed value or a missing row fails, timings and new columns are
not compared."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_metrics.py"
spec = importlib.util.spec_from_file_location("compare_metrics", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

HEADER = "step,rollout/samples_per_s,train/reward/total\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_identical_runs_pass_and_a_changed_bit_fails(tmp_path, capsys):
    a = write(tmp_path / "a.csv", HEADER + "0,10.0,0.5\n1,11.0,0.625\n")
    same = write(tmp_path / "b.csv", HEADER.replace("\n", ",train/new\n") + "0,99.0,0.5,3\n1,12.0,0.625,4\n")
    assert compare.main([str(a), str(same)]) == 0  # another timing and a new column: still the same run
    assert "identical: 2 rows x 2 columns" in capsys.readouterr().out
    changed = write(tmp_path / "c.csv", HEADER + "0,10.0,0.5\n1,11.0,0.6250000000000001\n")
    assert compare.main([str(a), str(changed)]) == 1
    assert "row 1 train/reward/total: 0.625 != 0.6250000000000001" in capsys.readouterr().out
    short = write(tmp_path / "d.csv", HEADER + "0,10.0,0.5\n")
    assert compare.main([str(a), str(short)]) == 1 and compare.main([str(a), str(short), "--rows", "1"]) == 0
