"""Runs a method with the average a ``flowrl.callbacks.EMA`` kept in a fit checkpoint
(``python -m flowrl predict --ckpt_path CKPT --ema``).

A fit checkpoint's ``state_dict`` holds the trained weights; the EMA's average travels in its callback state (so that
a resume continues both). This callback reads that average at ``setup``, before any weight loads (a checkpoint
without one fails there, naming the fix), and puts it into the module's weights when prediction or validation
starts, after Lightning restored the checkpoint's trained weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.distributed.tensor import DTensor, distribute_tensor


class EMAWeights(Callback):
    """Args:
        ckpt: the fit checkpoint (a file or a sharded checkpoint's folder) whose EMA average to use: the one given
            as ``--ckpt_path``.
    """

    def __init__(self, ckpt: str):
        self.ckpt = str(Path(ckpt).expanduser())
        self.average: dict[str, torch.Tensor] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        from flowrl.checkpoints.loading import checkpoint_average

        # memory-mapped: Lightning reads the whole checkpoint for the trained weights anyway; names as in state_dict
        self.average = checkpoint_average(self.ckpt)

    @torch.no_grad()
    def _apply(self, pl_module) -> None:
        params = dict(pl_module.named_parameters())
        if missing := sorted(set(self.average) - set(params))[:3]:
            raise ValueError(f"EMAWeights: the average of {self.ckpt} names weights this module has not (e.g. "
                             f"{missing}); predict with the config of the run that wrote it")
        for name, value in self.average.items():
            param, value = params[name], value.to(params[name].dtype)
            if isinstance(param, DTensor):  # a sharded checkpoint predicted under FSDP2 on one process
                value = distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
            param.copy_(value)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._apply(pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":  # `validate --ckpt_path`; never inside a fit
            self._apply(pl_module)
