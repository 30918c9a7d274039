"""The quickstart's promise, run in full: it raises the validation alignment reward (slow: ~5 minutes on 2 cores)."""

import csv
import re
from pathlib import Path

import pytest

from flowrl.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quickstart_raises_validation_alignment(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    main(["fit", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp_path}",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
          "--trainer.enable_progress_bar=false"])
    out = capsys.readouterr()
    before, after = map(float, re.search(r"val digit_alignment: ([\d.]+) -> ([\d.]+)", out.out + out.err).groups())
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    train = [float(r["train/reward/total"]) for r in rows if r.get("train/reward/total")]
    # RunSummary validates the base model before the first step (0.467 on the 512 validation samples); the kept seeds
    # gain about a third of the headroom to the classifier's 0.98 ceiling (docs/results.md), the test asks for 25%
    assert 0.4 < before < 0.56 and after - before > 0.25 * (0.98 - before), (before, after)
    assert sum(train[-20:]) / 20 > sum(train[:20]) / 20 + 0.1, (train[:20], train[-20:])
