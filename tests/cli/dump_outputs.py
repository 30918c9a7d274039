"""A test callback that saves each rank's per-sample seeds, advantages and rewards, the batch's model evaluations,
the final weights (LoRA, or
``full``: all of them), the gradient norm logged at each step, the bytes of the denoiser (and reference) each rank
holds, and (DenseGRPO) each rank's calibrated noise scales."""

from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.distributed.tensor import DTensor


class DumpOutputs(Callback):
    def __init__(self, out: str, full: bool = False):
        self.out, self.full = Path(out), full  # full: every weight of the policy, not just the LoRA ones

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.out.mkdir(parents=True, exist_ok=True)
        rows = {k: outputs[k].cpu() for k in ("seeds", "group_ids", "advantages", "rewards", "node_ids")
                if outputs.get(k) is not None}
        rows["devices"] = {"images": outputs["images"].device.type, "module": pl_module.device.type}
        if "rollout/evaluations" in trainer.callback_metrics:  # the batch's model calls, every rank's
            rows["evaluations"] = trainer.callback_metrics["rollout/evaluations"].cpu()
        rows["lr"] = [group["lr"] for opt in trainer.optimizers for group in opt.param_groups]  # after the batch
        if "train/grad_norm" in trainer.callback_metrics:
            rows["grad_norm"] = trainer.callback_metrics["train/grad_norm"].cpu()
        torch.save(rows, self.out / f"step{trainer.fit_loop.total_batch_idx}_rank{trainer.global_rank}.pt")

    def on_fit_end(self, trainer, pl_module):
        self.out.mkdir(parents=True, exist_ok=True)
        held = {name: sum(local_bytes(p) for p in module.parameters())  # what this rank holds of each denoiser
                for name in ("denoiser", "reference_denoiser") if (module := getattr(pl_module.policy, name, None))}
        torch.save(held, self.out / f"held_bytes_rank{trainer.global_rank}.pt")
        if getattr(pl_module, "noise_scales", None) is not None:
            torch.save(pl_module.noise_scales.cpu(), self.out / f"noise_scales_rank{trainer.global_rank}.pt")
        # FSDP2 holds each weight as a DTensor shard: gathered whole on every rank (a collective), saved by rank zero
        weights = {k: (v.full_tensor() if isinstance(v, DTensor) else v).cpu()
                   for k, v in pl_module.policy.state_dict().items() if "lora" in k or self.full}
        if trainer.is_global_zero:
            torch.save(weights, self.out / "weights.pt")


def local_bytes(p) -> int:
    """Bytes of ``p`` this rank holds: its shard under FSDP2, else the whole tensor."""
    local = p.to_local() if isinstance(p, DTensor) else p
    return local.numel() * local.element_size()
