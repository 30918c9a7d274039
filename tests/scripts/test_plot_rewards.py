"""scripts/plot_rewards.py on a CSVLogger-shaped file: series, cumulative NFE, and a real PNG."""

import importlib.util
from pathlib import Path

import pytest
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_rewards.py"


@pytest.fixture(scope="module")
def plot_rewards():
    spec = importlib.util.spec_from_file_location("plot_rewards", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_metrics(path: Path) -> Path:
    # CSVLogger writes one row per log call with empty cells for the other columns
    path.write_text("epoch,rollout/nfe,step,train/reward/total,val/reward/total\n"
                    "0,10,0,0.5,\n"
                    "0,,0,,0.4\n"
                    "0,10,1,0.7,\n"
                    "0,30,2,0.9,\n"
                    "0,,2,,0.8\n")
    return path


def test_series_reads_steps_and_cumulative_nfe(plot_rewards, tmp_path):
    rows = plot_rewards.read_metrics(write_metrics(tmp_path / "metrics.csv"))
    assert plot_rewards.series(rows, "train/reward/total") == ([0.0, 1.0, 2.0], [0.5, 0.7, 0.9])
    assert plot_rewards.series(rows, "train/reward/total", x="nfe") == ([10.0, 20.0, 50.0], [0.5, 0.7, 0.9])
    assert plot_rewards.series(rows, "val/reward/total") == ([0.0, 2.0], [0.4, 0.8])
    assert plot_rewards.moving_average([0.5, 0.7, 0.9], 2) == pytest.approx([0.5, 0.6, 0.8])


def test_main_writes_a_png_and_names_a_missing_file(plot_rewards, tmp_path):
    metrics = write_metrics(tmp_path / "metrics.csv")
    out = tmp_path / "curve.png"
    plot_rewards.main([f"run={metrics}", "--out", str(out), "--window", "2"])
    assert Image.open(out).size == (840, 480)  # figsize (7, 4) at 120 dpi
    with pytest.raises(SystemExit, match="no such metrics file"):
        plot_rewards.main([str(tmp_path / "missing.csv"), "--out", str(out)])
