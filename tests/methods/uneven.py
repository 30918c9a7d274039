"""A Flow-GRPO whose rows train different numbers of steps (rows with a seed divisible by 3 train their first step
only), so the ranks of a 2-process run hold different numbers of trained pairs; it saves each rank's count."""

from pathlib import Path

import torch

from flowrl.methods import FlowGRPO


class UnevenFlowGRPO(FlowGRPO):
    def rollout(self, batch, cond):
        rollout = super().rollout(batch, cond)
        short = (rollout.seeds % 3 == 0).to(rollout.train_mask.device)
        rollout.train_mask[short, 1:] = False
        if self.global_step == 0:
            out = Path(self.trainer.default_root_dir) / "dump"
            out.mkdir(parents=True, exist_ok=True)
            torch.save(int(rollout.train_mask.sum()), out / f"pairs_rank{self.trainer.global_rank}.pt")
        return rollout
