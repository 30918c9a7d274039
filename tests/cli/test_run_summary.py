"""RunSummary: the validation reward before and after training is printed and logged at step 0 and the last step."""

import csv
import re
from pathlib import Path

from flowrl.cli import main

CONFIG = str(Path(__file__).resolve().parent / "fit_tiny.yaml")


def test_before_and_after_are_printed_and_logged(tiny_model_dir, tmp_path, capsys):
    main(["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={tiny_model_dir}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=flowrl.callbacks.RunSummary",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
          "--data.val_prompts=[red 1 and green 9, blue 0 and blue 3]", "--model.init_args.num_minibatches=2",
          "--trainer.max_steps=4"])
    console = capsys.readouterr().out
    printed = dict(re.findall(r"val (\w+): ([\d.]+ -> [\d.]+)", console))
    assert re.search(r"first batch [\d.]+ -> last batch [\d.]+ over 2 batches \(4 optimizer steps\)", console)
    assert set(printed) == {"jpeg_incompressibility", "digit_alignment", "total"}

    rows = list(csv.DictReader(open(next(tmp_path.glob("lightning_logs/*/metrics.csv")))))
    logged = [(int(r["step"]), float(r["val/reward/total"])) for r in rows if r.get("val/reward/total")]
    before, after = (float(v) for v in printed["total"].split(" -> "))
    # before the first batch and after the second: 4 optimizer steps in 2 batches, and Lightning's rows count batches
    assert [step for step, _ in logged] == [0, 2]
    assert max(int(r["step"]) for r in rows if r.get("train/reward/total")) == 1
    assert f"{logged[0][1]:.4f}" == f"{before:.4f}" and f"{logged[1][1]:.4f}" == f"{after:.4f}"
    assert logged[0][1] != logged[1][1]  # lr 1e-2 for 2 steps changes the samples
