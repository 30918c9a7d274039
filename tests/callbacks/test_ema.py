"""EMA of the trainable weights: hand-computed averages on a module whose weights are 1, 2, 3, ... after each step;
only trainable parameters are shadowed; swapping is exact; a CLI fit checks the average against its checkpoints, and
a resumed run continues it exactly."""

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader

from flowrl.callbacks import EMA
from flowrl.cli import main
from tests.cli.test_fit import fit_args


class CountingPolicy(nn.Module):
    """``w`` (trained) and a frozen table ten times its size."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
        self.frozen = nn.Parameter(torch.ones(30), requires_grad=False)

    def trainable_parameters(self):
        return [self.w]


class Counting(LightningModule):
    """SGD with lr 1 on ``-sum(w)``: the gradient is -1, so ``w`` is exactly k after k optimizer steps."""

    def __init__(self, policy: bool = True):
        super().__init__()
        self.automatic_optimization = False
        if policy:
            self.policy = CountingPolicy()
        else:
            self.w, self.frozen = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.ones(30), requires_grad=False)
        self.validated: list[tuple[int, float]] = []

    def weight(self) -> torch.Tensor:
        return self.policy.w if hasattr(self, "policy") else self.w

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(-self.weight().sum())
        opt.step()

    def validation_step(self, batch, batch_idx):
        self.validated.append((self.global_step, float(self.weight()[0])))

    def configure_optimizers(self):
        return torch.optim.SGD([self.weight()], lr=1.0)

    def train_dataloader(self):
        return DataLoader(torch.zeros(16, 1), batch_size=1)

    def val_dataloader(self):
        return DataLoader(torch.zeros(1, 1), batch_size=1)


class Record(Callback):
    """The average after each training batch (runs after EMA: callbacks run in list order)."""

    def __init__(self, ema: EMA):
        self.ema, self.seen = ema, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(float(next(iter(self.ema.shadow.values()))[0]))


def fit_counting(ema: EMA, steps: int, module=None, **trainer_kwargs) -> tuple[list[float], LightningModule]:
    module = module or Counting()
    record = Record(ema)
    kwargs = dict(limit_val_batches=0, num_sanity_val_steps=0) | trainer_kwargs
    trainer = Trainer(max_steps=steps, callbacks=[ema, record], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **kwargs)
    trainer.fit(module)
    return record.seen, module


def test_warmup_average_by_hand():
    seen, module = fit_counting(EMA(decay=0.9, warmup=True, apply_at_end=False), steps=3)
    # shadow starts at w = 0; after step n the decay is min(0.9, (1 + n) / (10 + n)) and w = n:
    # step 1: d = 2/11  -> 2/11 * 0 + 9/11 * 1 = 9/11
    # step 2: d = 3/12  -> 1/4 * 9/11 + 3/4 * 2 = 75/44
    # step 3: d = 4/13  -> 4/13 * 75/44 + 9/13 * 3 = 372/143
    assert seen == pytest.approx([9 / 11, 75 / 44, 372 / 143], rel=1e-6)
    assert torch.equal(module.policy.w, torch.full((3,), 3.0))  # apply_at_end=False keeps the trained weights


def test_constant_decay_interval_and_start_by_hand():
    seen, _ = fit_counting(EMA(decay=0.5, warmup=False, apply_at_end=False), steps=3)
    # 0.5 * 0 + 0.5 * 1 = 0.5; 0.5 * 0.5 + 0.5 * 2 = 1.25; 0.5 * 1.25 + 0.5 * 3 = 2.125
    assert seen == [0.5, 1.25, 2.125]
    seen, _ = fit_counting(EMA(decay=0.5, every_n_steps=2, start_step=2, warmup=False, apply_at_end=False), steps=5)
    # step 1 < start_step: copy (1); step 2: 0.5 * 1 + 0.5 * 2 = 1.5; step 3: no update; step 4: 0.5 * 1.5 + 2 = 2.75
    assert seen == [1.0, 1.5, 1.5, 2.75, 2.75]


def test_validation_sees_the_average_and_training_continues_from_the_trained_weights():
    ema = EMA(decay=0.5, warmup=False)
    seen, module = fit_counting(ema, steps=3, module=Counting(policy=False), limit_val_batches=1,
                                val_check_interval=2)
    assert module.validated == [(2, 1.25)]  # the average after step 2
    assert seen == [0.5, 1.25, 2.125]  # step 3 trained from w = 2 (restored), not from 1.25
    # apply_at_end: the module ends with the average; the fallback (no policy) shadows only `w`
    assert torch.equal(module.w, torch.full((3,), 2.125)) and set(ema.shadow) == {"w"}


def test_only_trainable_parameters_are_shadowed_in_float32():
    ema = EMA()
    fit_counting(ema, steps=1)
    assert set(ema.shadow) == {"policy.w"}
    assert sum(t.numel() for t in ema.shadow.values()) == 3  # the 30 frozen numbers are not copied
    assert all(t.dtype == torch.float32 for t in ema.shadow.values())


def test_swap_round_trip_is_bit_exact():
    module = Counting()
    module.policy.w = nn.Parameter(torch.randn(1000, dtype=torch.bfloat16))  # lossy copy of the float32 average
    ema = EMA()
    ema.on_train_start(Trainer(logger=False, enable_checkpointing=False), module)
    live = module.policy.w.detach().clone()
    torch.manual_seed(1)
    next(iter(ema.shadow.values())).add_(torch.randn(1000) * 1e-3)  # an average that differs in low bits
    ema.swap_in()
    assert torch.equal(module.policy.w, next(iter(ema.shadow.values())).to(torch.bfloat16))
    checkpoint = {"state_dict": module.state_dict()}  # a checkpoint saved during validation keeps the trained weights
    ema.on_save_checkpoint(None, module, checkpoint)
    assert torch.equal(checkpoint["state_dict"]["policy.w"], live)
    ema.swap_out()
    assert torch.equal(module.policy.w, live)


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match=r"decay=1.0 must lie in \(0, 1\)"):
        EMA(decay=1.0)
    with pytest.raises(ValueError, match="decay=0.*every_n_steps=0 must be >= 1"):  # gathered into one error
        EMA(decay=0.0, every_n_steps=0)


def ema_state(ckpt: Path) -> tuple[dict, dict]:
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("EMA")]
    return saved["state_dict"], state


CKPT_EVERY = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_top_k=-1"]


def test_cli_fit_averages_the_lora_weights(tiny_model_dir, tmp_path):
    main(fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=3", "--trainer.callbacks+=flowrl.callbacks.EMA",
                  *CKPT_EVERY, "--trainer.callbacks.every_n_train_steps=1"))
    states = [ema_state(next(tmp_path.rglob(f"*step={k}.ckpt"))) for k in (1, 2, 3)]
    weights, shadow = states[0][0], states[0][1]["shadow"]
    lora = torch.load(tmp_path / "dump/weights.pt")  # the policy's LoRA weights at the end of fit
    assert set(shadow) == {f"policy.{k}" for k in lora}  # only the trainable (LoRA) weights
    assert sum(t.numel() for t in shadow.values()) < sum(t.numel() for k, t in weights.items() if "lora" not in k)
    for name in shadow:  # step 1, d = 2/11: LoRA B starts at 0, so its average is 9/11 of the trained B
        if "lora_B" in name:
            torch.testing.assert_close(shadow[name], 9 / 11 * weights[name], rtol=1e-6, atol=1e-9)
    for step in (2, 3):  # d = (1 + n) / (10 + n) after n steps: average <- d * average + (1 - d) * weights
        (_, before), (weights, after) = states[step - 2], states[step - 1]
        d = (1 + step) / (10 + step)
        for name, value in after["shadow"].items():
            expected = d * before["shadow"][name] + (1 - d) * weights[name]
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-7)
        assert after["num_updates"] == step
    # apply_at_end: the weights RunSummary and exports see at the end of fit are the average
    assert all(torch.equal(lora[k], states[-1][1]["shadow"][f"policy.{k}"]) for k in lora)


def test_cli_resume_continues_the_average_exactly(tiny_model_dir, tmp_path):
    ema = ["--trainer.callbacks+=flowrl.callbacks.EMA", *CKPT_EVERY, "--trainer.callbacks.every_n_train_steps=2"]
    main(fit_args(tiny_model_dir, tmp_path / "straight", "--trainer.max_steps=4", *ema))
    # the straight run's own step-2 checkpoint: the one a run stopped at step 2 writes (the batch ends both)
    saved = next(Path(tmp_path / "straight").rglob("*step=2.ckpt"))
    main(fit_args(tiny_model_dir, tmp_path / "resumed", "--trainer.max_steps=4", *ema, f"--ckpt_path={saved}"))
    _, straight = ema_state(next(Path(tmp_path / "straight").rglob("*step=4.ckpt")))
    _, resumed = ema_state(next(Path(tmp_path / "resumed").rglob("*step=4.ckpt")))
    assert straight["num_updates"] == resumed["num_updates"] == 4
    assert all(torch.equal(straight["shadow"][k], resumed["shadow"][k]) for k in straight["shadow"])
