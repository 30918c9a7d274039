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
        # read off the gathered batch (or reduced over ranks): metrics.csv holds rank zero's row, which must be the
        # whole batch's value, as one process would log it
        size, rows = rollout.batch_size, sum(batch.sizes) or rollout.batch_size
        log = lambda name, value, **kw: self.log(name, value, batch_size=size, **kw)  # noqa: E731
        for name, scores in batch.rewards.items():
            finite = torch.isfinite(scores)
            log(f"train/reward/{name}", scores[finite].mean() if finite.any() else torch.nan)
            if not finite.all():
                log(f"train/reward/{name}_nonfinite", (~finite).sum().float())
        total, valid = self.reward_set.total(batch.rewards)[0], batch.valid
        log("train/reward/total", total[valid].mean() if valid.any() else torch.nan, prog_bar=True)
        trained = batch.advantages[batch.trained]
        log("train/advantage/mean", trained.mean())
        log("train/advantage/std", trained.std() if trained.numel() > 1 else torch.zeros(()))
        for key, value in self.global_metrics(metrics, int(rollout.train_mask.sum()), size).items():
            log(f"train/{key}", value)
        nfe = float(batch.nfe.sum()) / rows  # mean model evaluations per row (a tree's leaf: its share)
        log("rollout/nfe", nfe)
        log("rollout/forward_passes", nfe * (2 if guided and self.guidance_scale != 1.0 else 1))  # a CFG pair: 2
        # the batch's model evaluations over every rank: the compute budget methods are compared at
        log("rollout/evaluations", rollout.nfe.sum().float() + self.unlogged_evaluations, reduce_fx="sum",
            sync_dist=True)
        self.unlogged_evaluations = 0.0
        transitions = int(batch.trained.sum())  # the batch's evaluations per transition the loss trains
        log("rollout/nfe_per_trained_step", float(batch.nfe.sum()) / transitions if transitions else float("nan"))
        # the ranks sample side by side: the run's rate is the sum of theirs
        log("rollout/samples_per_s", size / max(sampling_s, 1e-9), reduce_fx="sum", sync_dist=True)
