"""A test callback that saves each rank's per-sample seeds, advantages and rewards, the final weights and (DenseGRPO)
each rank's calibrated noise scales."""

from pathlib import Path

import torch
from lightning.pytorch import Callback


class DumpOutputs(Callback):
    def __init__(self, out: str):
        self.out = Path(out)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.out.mkdir(parents=True, exist_ok=True)
        rows = {k: outputs[k].cpu() for k in ("seeds", "group_ids", "advantages", "rewards", "node_ids")
                if outputs.get(k) is not None}
        torch.save(rows, self.out / f"step{trainer.fit_loop.total_batch_idx}_rank{trainer.global_rank}.pt")

    def on_fit_end(self, trainer, pl_module):
        if getattr(pl_module, "noise_scales", None) is not None:
            torch.save(pl_module.noise_scales.cpu(), self.out / f"noise_scales_rank{trainer.global_rank}.pt")
        if trainer.is_global_zero:
            weights = {k: v.cpu() for k, v in pl_module.policy.state_dict().items() if "lora" in k}
            torch.save(weights, self.out / "weights.pt")
