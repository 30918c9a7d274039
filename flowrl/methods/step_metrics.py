"""The metrics every method logs after each batch, under the same names (``train/reward/<name>``,
``train/advantage/{mean,std}``, ``rollout/{nfe,evaluations,...}``, then the update's ``train/<key>``, among them
:data:`UPDATE_METRICS` and the loop's ``train/{forward_passes,nonfinite_steps,untrained_batches}``): a layer of
:class:`~flowrl.methods.base.BaseModule`, so that a method's update returns numbers and never logs them itself."""

from __future__ import annotations

import torch

from flowrl.methods.batch import Batch
from flowrl.methods.distributed import Distributed
from flowrl.sampling.rollout import Rollout

#: what every method's ``update`` returns (logged as ``train/<key>``): the trained policy's loss and its gradient norm
#: before clipping (means over the batch's optimizer steps; the loop counts the passes and skipped steps itself)
UPDATE_METRICS = ("loss", "grad_norm")


class StepMetrics(Distributed):
    """Logs one batch's metrics (reads the method's ``reward_set``, ``guidance_scale`` and ``unlogged_evaluations``)."""

    def log_step(self, rollout: Rollout, batch: Batch, metrics: dict[str, float], sampling_s: float,
                 guided: bool) -> None:
        """The metrics every method logs, with the same names, then ``train/<key>`` of ``metrics``."""
        size = rollout.batch_size
        log = lambda name, value, **kw: self.log(name, value, batch_size=size, **kw)  # noqa: E731
        for name, scores in rollout.rewards.items():
            finite = torch.isfinite(scores)
            log(f"train/reward/{name}", scores[finite].mean() if finite.any() else torch.nan, sync_dist=True)
            if not finite.all():
                log(f"train/reward/{name}_nonfinite", (~finite).sum().float(), reduce_fx="sum", sync_dist=True)
        total, valid = self.reward_set.total(rollout.rewards)[0], batch.mine(batch.valid)
        log("train/reward/total", total[valid].mean() if valid.any() else torch.nan, prog_bar=True, sync_dist=True)
        trained = batch.mine(batch.advantages)[rollout.train_mask]
        log("train/advantage/mean", trained.mean())
        log("train/advantage/std", trained.std() if trained.numel() > 1 else torch.zeros(()))
        for key, value in metrics.items():
            log(f"train/{key}", value)
        nfe = float(rollout.nfe.sum()) / size  # mean model evaluations per row (a tree's leaf: its share)
        log("rollout/nfe", nfe)
        log("rollout/forward_passes", nfe * (2 if guided and self.guidance_scale != 1.0 else 1))  # a CFG pair: 2
        # the batch's model evaluations over every rank: the compute budget methods are compared at
        log("rollout/evaluations", rollout.nfe.sum().float() + self.unlogged_evaluations, reduce_fx="sum",
            sync_dist=True)
        self.unlogged_evaluations = 0.0
        transitions = int(rollout.train_mask.sum())  # the batch's evaluations per transition the loss trains
        log("rollout/nfe_per_trained_step", float(rollout.nfe.sum()) / transitions if transitions else float("nan"))
        log("rollout/samples_per_s", size / max(sampling_s, 1e-9))
