"""A Flow-GRPO whose loss (or only its gradient) turns NaN on chosen batches and ranks, for the tests of skipping
non-finite optimizer steps; it records the trainable weights after every batch."""

import dataclasses
from pathlib import Path
from typing import Optional

import torch

from flowrl.methods import FlowGRPO
from flowrl.training.ppo_update import PPOUpdate


class NaNGradient(torch.autograd.Function):
    """Identity forward, NaN gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


class NonFinitePPO(PPOUpdate):
    """The PPO update whose loss turns NaN while ``poison`` says how (``loss``, ``loss_only``, ``gradient``)."""

    poison: Optional[str] = None

    def pair_loss(self, *args, **kwargs):
        loss, stats = super().pair_loss(*args, **kwargs)
        if self.poison == "loss":
            loss = loss + float("nan")
        elif self.poison == "loss_only":  # a NaN value whose gradient is finite (0)
            loss = loss * 0 + float("nan")
        elif self.poison == "gradient":
            loss = NaNGradient.apply(loss)
        return loss, stats


class NonFiniteFlowGRPO(FlowGRPO):
    def __init__(self, *args, nan_batches: Optional[list[int]] = None, nan_ranks: Optional[list[int]] = None,
                 nan_in: str = "loss", dump_dir: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.nan_batches, self.nan_ranks = list(nan_batches or []), list(nan_ranks or [0, 1])
        self.nan_in, self.dump_dir = nan_in, dump_dir
        self.ppo = NonFinitePPO(**dataclasses.asdict(self.ppo))
        self.batch, self.weights = 0, []

    def training_step(self, batch, batch_idx):
        self.batch = self.trainer.fit_loop.total_batch_idx
        hit = self.batch in self.nan_batches and self.trainer.global_rank in self.nan_ranks
        self.ppo.poison = self.nan_in if hit else None
        return super().training_step(batch, batch_idx)


    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.weights.append({n: p.detach().clone() for n, p in self.policy.named_parameters() if p.requires_grad})

    def on_fit_end(self):
        if self.dump_dir:
            Path(self.dump_dir).mkdir(parents=True, exist_ok=True)
            torch.save({"weights": self.weights[-1], "global_step": self.global_step, "batches": len(self.weights)},
                       Path(self.dump_dir) / f"rank{self.trainer.global_rank}.pt")
