"""An ``evaluate`` that cannot finish says so: more processes than batches is refused before any weight loads (it
once crashed both processes after loading), and a SIGTERM stops it after the current batch with exit status 143,
leaving the folder marked ``INCOMPLETE`` and no earlier report beside the redrawn images (it once ran to its end and
exited 0, and a kill left the old report.md, scores.csv and evaluation.json as if current)."""

import os
import signal
import subprocess
import sys

import pytest

import flowrl.evaluation.models as models
from flowrl.cli import main
from tests.evaluation.conftest import ROOT, SEEDS, STEPS
from tests.evaluation.test_command import fake_run
from tests.sigterm import sigterm_when, terminate, wait_for

# one xdist worker runs this file (pytest's --dist loadgroup): the session's brightness fit and evaluation
# (tests/evaluation/conftest.py) is built once, not once per worker
pytestmark = pytest.mark.xdist_group("evaluation")

OLD_REPORT = ("report.md", "scores.csv", "evaluation.json")


def test_more_processes_than_batches_is_refused_before_any_weight_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(models, "load_models", lambda *a, **k: pytest.fail("weights loaded before the check"))
    ckpt = fake_run(tmp_path / "run", "flowrl/tiny-digits")
    (tmp_path / "suite.txt").write_text("red 1 and blue 2\ngreen 3 and red 4\nblue 5 and green 6\n")
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--ckpt_path", f"a={ckpt}", "--suite", str(tmp_path / "suite.txt"), "--seeds", "0", "1",
              "--batch_size", "6", "--devices", "2", "--accelerator", "cpu", "--out", str(tmp_path / "out")])
    assert str(exit_.value) == (
        "flowrl evaluate: invalid options:\n  --devices 2: 3 prompts in batches of 3 (--batch_size 6 over 2 seeds) "
        "make 1 batch, so 1 of the 2 processes would draw nothing; use --devices 1, or --batch_size 2 or less")
    assert not (tmp_path / "out").exists()


def report_args(untrained_lora, suite16, out, devices: str) -> list[str]:
    """``evaluate`` of 16 batches of one prompt into ``out``, which holds an earlier evaluation's report (naming
    another checkpoint)."""
    out.mkdir()
    for name in OLD_REPORT:
        (out / name).write_text("an earlier evaluation of another checkpoint")
    return ["evaluate", "--config", "tests/evaluation/fit_brightness.yaml",
            "--ckpt_path", f"untrained={untrained_lora}", "--suite", str(suite16), "--seeds", *map(str, SEEDS),
            "--num_steps", str(STEPS), "--batch_size", "2", "--out", str(out), "--resamples", "100",
            "--accelerator", "cpu", "--devices", devices]


def assert_stopped_without_a_report(said: str, out) -> None:
    """What a SIGTERM after the first batch leaves: one notice, no report (the earlier one removed, each said),
    ``INCOMPLETE``, and fewer images than every batch draws."""
    assert said.count("flowrl evaluate: SIGTERM received: stopping after the current batch") == 1, said[-3000:]
    assert f"flowrl evaluate: stopped by SIGTERM; {out} has no report" in said
    for name in OLD_REPORT:
        assert not (out / name).exists(), name
        assert f"flowrl evaluate: removed {out / name} (an earlier evaluation's" in said
    assert "has not finished" in (out / "INCOMPLETE").read_text()
    assert len(list((out / "images" / "untrained").iterdir())) < 16 * len(SEEDS)  # not every batch was drawn


def test_sigterm_stops_after_the_batch_exits_143_and_leaves_no_stale_report(untrained_lora, suite16, tmp_path, capfd,
                                                                            monkeypatch):
    # in this process: the signal comes from a thread, at a moment the command does not choose, as from a scheduler
    monkeypatch.chdir(ROOT)
    out = tmp_path / "report"
    args = report_args(untrained_lora, suite16, out, "1")
    drawn = out / "images" / "untrained"  # the last model of each batch: its first image ends the first batch
    with sigterm_when(lambda: drawn.is_dir() and any(drawn.iterdir())), pytest.raises(SystemExit) as stopped:
        main(args)
    said = capfd.readouterr().out
    assert stopped.value.code == 128 + signal.SIGTERM, said[-3000:]
    assert_stopped_without_a_report(said, out)


# slow: DDP, where a first version broke the process group; a SIGTERM in evaluate is covered above, evaluate on 2 DDP
# processes by tests/evaluation/test_ddp.py
@pytest.mark.slow
def test_sigterm_stops_both_ddp_processes_of_a_launched_evaluate(untrained_lora, suite16, tmp_path):
    out = tmp_path / "report"
    args = report_args(untrained_lora, suite16, out, "2")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowrl", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    drawn = out / "images" / "untrained"
    wait_for(proc, lambda: drawn.is_dir() and any(drawn.iterdir()), "no image drawn")
    said = terminate(proc, "evaluate")
    assert proc.returncode == 128 + signal.SIGTERM, said[-3000:]
    assert_stopped_without_a_report(said, out)
