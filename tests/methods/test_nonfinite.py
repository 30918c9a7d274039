"""Non-finite numbers never train and never score as 0: an optimizer step with a NaN loss or gradient is skipped
and counted (on every rank alike: tests/methods/test_two_ranks_equal_one.py), too many in a row stop the run with the quantity named, and validation and the
run summary leave NaN rewards out of their means and count them."""

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from flowrl.cli import main

HERE = Path(__file__).resolve().parent
CONFIG = str(HERE.parent / "cli" / "fit_tiny.yaml")
METHOD = "tests.methods.nonfinite.NonFiniteFlowGRPO"


def fit(tiny_model_dir, out, *extra):
    """fit_tiny.yaml with the NaN-injecting method in place of FlowGRPO."""
    config = Path(out) / "nonfinite.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(Path(CONFIG).read_text().replace("class_path: flowrl.methods.FlowGRPO", f"class_path: {METHOD}"))
    return ["fit", "--config", str(config), f"--model.init_args.policy.init_args.model={tiny_model_dir}",
            f"--trainer.default_root_dir={out}", *extra]


class KeepModule(Callback):
    """Keeps the trained module where the test can read it."""

    last = None

    def on_fit_end(self, trainer, pl_module):
        KeepModule.last = pl_module


def trained_module(args):
    main(args + ["--trainer.callbacks+=tests.methods.test_nonfinite.KeepModule"])
    return KeepModule.last


def logged(out: Path, key: str) -> list[tuple[int, float]]:
    (metrics,) = out.glob("**/metrics.csv")
    return [(int(r["step"]), float(r[key])) for r in csv.DictReader(metrics.open()) if r.get(key)]


@pytest.mark.parametrize("nan_in", ["loss", "gradient"])
def test_a_nonfinite_step_is_skipped_counted_and_training_goes_on(tiny_model_dir, tmp_path, nan_in):
    csv_logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}"]
    module = trained_module(fit(tiny_model_dir, tmp_path, "--model.init_args.nan_batches=[0]",
                                f"--model.init_args.nan_in={nan_in}", "--trainer.max_steps=2", *csv_logger))
    first, last = module.weights[0], module.weights[-1]
    lora_b = [n for n in first if "lora_B" in n]  # LoRA B starts at 0
    assert lora_b and all(not first[n].any() for n in lora_b)  # batch 0 took no step
    assert all(torch.isfinite(w).all() for w in last.values())
    assert any(last[n].any() for n in lora_b)  # batches 1 and 2 trained
    assert len(module.weights) == 3 and module.global_step == 2  # the skipped step did not count towards max_steps
    assert [v for _, v in logged(tmp_path, "train/nonfinite_steps")] == [1.0, 0.0, 0.0]
    assert module.nonfinite.in_a_row == 0


@pytest.mark.parametrize("nan_in, quantity", [("loss", "the loss"), ("gradient", "the gradient norm")])
def test_nonfinite_steps_in_a_row_stop_the_run_naming_the_quantity(tiny_model_dir, tmp_path, nan_in, quantity):
    with pytest.raises(FloatingPointError, match=rf"{quantity} was NaN or inf at 2 optimizer steps in a row"):
        main(fit(tiny_model_dir, tmp_path, "--model.init_args.nan_batches=[0, 1, 2, 3]",
                 f"--model.init_args.nan_in={nan_in}", "--model.init_args.max_nonfinite_steps=2"))


def test_validation_and_summary_leave_nan_rewards_out_and_count_them(tiny_model_dir, tmp_path, capsys):
    functions = "tests.rewards.reward_functions"
    val = ["red 1 and green 9", "blue 2 and blue 3", "green 4 and red 5", "blue 6 and green 7"]
    main(["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={tiny_model_dir}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks=[]",
          "--trainer.callbacks+=flowrl.rewards.FunctionReward", f"--trainer.callbacks.function={functions}.first_digit",
          "--trainer.callbacks+=flowrl.rewards.FunctionReward",
          f"--trainer.callbacks.function={functions}.first_digit_unless_red", "--trainer.callbacks.name=holey",
          "--trainer.callbacks+=flowrl.callbacks.RunSummary", f"--data.val_prompts=[{', '.join(val)}]",
          "--data.prompts=[red 1 and green 9, blue 2 and blue 3]", "--data.val_samples_per_prompt=2",
          "--trainer.limit_val_batches=1.0", "--trainer.val_check_interval=1",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}"])
    out = capsys.readouterr().out
    # first digits 1, 2, 4, 6, each prompt twice; "holey" is NaN on the "red" prompt (1) and so is the total there
    expected = {"first_digit": (1 + 2 + 4 + 6) / 4, "holey": (2 + 4 + 6) / 3, "total": 2 * (2 + 4 + 6) / 3}
    for name, value in expected.items():
        assert f"val {name}: {value:.4f} -> {value:.4f}" in out  # the rewards ignore the images: before == after
        values = [v for _, v in logged(tmp_path, f"val/reward/{name}")]
        assert len(values) == 4 and values == pytest.approx([value] * 4)  # summary before, 2 validations, after
    assert [v for _, v in logged(tmp_path, "val/reward/holey_nonfinite")] == [2.0] * 4  # 1 prompt x 2 samples
    assert [v for _, v in logged(tmp_path, "val/reward/total_nonfinite")] == [2.0] * 4
    assert "val holey_nonfinite (left out of the means): 2 -> 2" in out
    # each training batch: 4 samples of the red prompt (invalid) and 4 of "blue 2" (total 2 + 2), never 0 for NaN
    assert [v for _, v in logged(tmp_path, "train/reward/total")] == [4.0, 4.0]
    assert "first batch 4.0000 -> last batch 4.0000" in out
