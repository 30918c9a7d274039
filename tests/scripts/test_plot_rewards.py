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
    # CSVLogger writes one row per log call with empty cells for the other columns; the validation before training
    # comes first
    path.write_text("epoch,rollout/nfe,step,train/reward/total,val/reward/total\n"
                    "0,,0,,0.4\n"
                    "0,10,0,0.5,\n"
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


def test_seeds_of_one_run_give_a_band_and_a_table(plot_rewards, tmp_path):
    a = write_metrics(tmp_path / "a.csv")
    b = tmp_path / "b.csv"
    b.write_text(a.read_text().replace("0.7,", "0.3,").replace(",0.8", ",0.6"))
    xs, mean, low, high = plot_rewards.seed_band([plot_rewards.series(plot_rewards.read_metrics(p), "train/reward/total")
                                                  for p in (a, b)])
    assert xs == [0.0, 1.0, 2.0] and mean == pytest.approx([0.5, 0.5, 0.9])
    assert low == pytest.approx([0.5, 0.3, 0.9]) and high == pytest.approx([0.5, 0.7, 0.9])
    # 3 training steps: an eighth is 1 step; NFE 10 + 10 + 30; validation 0.4 -> 0.8 and 0.4 -> 0.6
    row = plot_rewards.table({"flow": [a, b]}).splitlines()[2]
    # gains paired by seed: 0.8 - 0.4 and 0.6 - 0.4
    assert row == ("| flow | 2 | 50 | 0.500 +- 0.000 | 0.900 +- 0.000 | 0.400 +- 0.000 | 0.700 +- 0.141 | "
                   "0.300 +- 0.141 |")
    out = tmp_path / "band.png"
    plot_rewards.main([f"flow={a},{b}", f"single={a}", "--x", "nfe", "--out", str(out), "--window", "2", "--table"])
    assert Image.open(out).size == (840, 480)
    plot_rewards.main([f"flow={a},{b}", "--x", "nfe", "--out", str(out), "--window", "2", "--split"])
    assert Image.open(out).size == (1320, 550)  # two panels, the legend below


def test_the_gain_by_half_the_evaluations_is_the_last_validation_before_it(plot_rewards, tmp_path):
    # 100 evaluations in all; validations at 0 (0.4), 40 (0.5), 60 (0.9) and 100 (0.7): by 50 the gain is 0.5 - 0.4
    a = tmp_path / "a.csv"
    a.write_text("epoch,rollout/evaluations,step,train/reward/total,val/reward/total\n"
                 "0,,0,,0.4\n0,40,0,0.5,\n0,,0,,0.5\n0,20,1,0.6,\n0,,1,,0.9\n0,40,2,0.7,\n0,,2,,0.7\n")
    header, _, row = plot_rewards.table({"run": [a]}).splitlines()
    assert header.endswith("| gain (paired by seed) | gain by half the evaluations | model evaluations |")
    assert row.endswith("| 0.400 | 0.700 | 0.300 | 0.100 | 100 |")


def test_minutes_come_from_the_tensorboard_events_beside_the_metrics(plot_rewards, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    metrics = write_metrics(tmp_path / "metrics.csv")
    with pytest.raises(SystemExit, match="no TensorBoard events file"):
        plot_rewards.main([str(metrics), "--x", "minutes", "--out", str(tmp_path / "x.png")])
    writer = SummaryWriter(tmp_path)  # what Lightning's TensorBoardLogger writes, with chosen wall times
    for tag, step, seconds in [("val/reward/total", 0, 1000.0), ("train/reward/total", 0, 1030.0),
                               ("train/reward/total", 1, 1060.0), ("train/reward/total", 2, 1120.0),
                               ("val/reward/total", 2, 1180.0)]:
        writer.add_scalar(tag, 0.0, step, walltime=seconds)
    writer.close()
    rows = plot_rewards.attach_minutes(plot_rewards.read_metrics(metrics), metrics)
    assert plot_rewards.series(rows, "train/reward/total", "minutes") == ([0.5, 1.0, 2.0], [0.5, 0.7, 0.9])
    assert plot_rewards.series(rows, "val/reward/total", "minutes") == ([0.0, 3.0], [0.4, 0.8])
    assert plot_rewards.table({"run": [metrics]}).splitlines()[2].endswith("| 3.0 |")  # the run's wall minutes
    plot_rewards.main([f"a={metrics}", f"b={metrics}", "--x", "minutes", "--out", str(tmp_path / "m.png")])
    assert Image.open(tmp_path / "m.png").size == (840, 480)


def test_seeds_with_different_steps_are_refused(plot_rewards, tmp_path):
    a = write_metrics(tmp_path / "a.csv")
    b = tmp_path / "b.csv"
    b.write_text(a.read_text().replace("0,10,1,0.7,", "0,20,1,0.7,"))  # a different NFE at step 1
    with pytest.raises(SystemExit, match="different steps or NFE"):
        plot_rewards.main([f"flow={a},{b}", "--x", "nfe", "--out", str(tmp_path / "x.png")])


def test_by_half_counts_a_validation_at_half_and_none_past_it(plot_rewards):
    points = [(0.0, 0.4), (50.0, 0.5), (50.5, 0.9)]
    assert plot_rewards.by_half(points, 100.0) == (50.0, 0.5)  # at exactly half: by half
    assert plot_rewards.by_half(points, 100.9) == (50.0, 0.5)  # 50.5 is past 50.45: not, however close
    assert plot_rewards.by_half(points, 101.0) == (50.5, 0.9)
    assert plot_rewards.by_half([(60.0, 0.5)], 100.0) is None


def test_main_needs_runs_unless_it_prints_the_results_page(plot_rewards, capsys):
    with pytest.raises(SystemExit):
        plot_rewards.main([])
    assert "give the runs' metrics.csv files (or --results)" in capsys.readouterr().err


def test_a_run_without_a_validation_before_training_has_no_base(plot_rewards, tmp_path):
    # its first validation comes after two batches: not a base to pair the gain with (NaN, not 0.6)
    a = tmp_path / "a.csv"
    a.write_text("epoch,step,train/reward/total,val/reward/total\n0,0,0.5,\n0,1,0.6,\n0,1,,0.6\n0,2,0.7,\n0,2,,0.8\n")
    row = plot_rewards.table({"run": [a, a]}).splitlines()[2]
    assert row.endswith("| nan | 0.800 +- 0.000 | nan |")
