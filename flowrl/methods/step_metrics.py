"""The metrics every method logs after each batch, under the same names (``train/reward/<name>``,
``train/advantage/{mean,std}``, ``rollout/{nfe,evaluations,...}``, then the update's ``train/<key>``, among them
:data:`UPDATE_METRICS` and the loop's ``train/{forward_passes,nonfinite_steps,untrained_batches}``): an object the
loop (:class:`~flowrl.methods.base.BaseModule`) builds per batch, so that a method's update returns numbers and never
logs them itself."""

from __future__ import annotations

from typing import Callable

import torch

from flowrl.methods.batch import Batch
from flowrl.rewards.reward_set import RewardSet
from flowrl.sampling.rollout import Rollout

#: what every method's ``update`` returns (logged as ``train/<key>``): the trained policy's loss and its gradient norm
#: before clipping (means over the batch's optimizer steps; the loop counts the passes and skipped steps itself)
UPDATE_METRICS = ("loss", "grad_norm")


class StepMetrics:
    """Logs one batch's metrics.

    Args:
        log: the module's ``log``.
        reward_set: the reward callbacks (their weighted total).
        global_metrics: :meth:`~flowrl.methods.distributed.Ranks.global_metrics` (a rank's update metrics as the
            whole batch's).
        once: :meth:`~flowrl.methods.distributed.Ranks.once` (a sum over every process counts each data-parallel
            replica once; default: every process is one).
    """

    def __init__(self, log: Callable, reward_set: RewardSet, global_metrics: Callable,
                 once: Callable = lambda x: x):
        self.log, self.reward_set, self.global_metrics, self.once = log, reward_set, global_metrics, once

    def log_step(self, rollout: Rollout, batch: Batch, metrics: dict[str, float], sampling_s: float,
                 cfg_pairs: bool, unlogged_evaluations: float = 0.0) -> None:
        """The metrics every method logs, with the same names, then ``train/<key>`` of ``metrics``. ``cfg_pairs``:
        each evaluation was a classifier-free guidance pair (2 forward passes); ``unlogged_evaluations``: evaluations
        spent outside rollouts since the last batch (noise calibration), counted in ``rollout/evaluations``."""
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
        log("rollout/forward_passes", nfe * (2 if cfg_pairs else 1))  # a CFG pair: 2
        # the batch's model evaluations over every rank: the compute budget methods are compared at
        log("rollout/evaluations", self.once(rollout.nfe.sum().float() + unlogged_evaluations), reduce_fx="sum",
            sync_dist=True)
        transitions = int(batch.trained.sum())  # the batch's evaluations per transition the loss trains
        log("rollout/nfe_per_trained_step", float(batch.nfe.sum()) / transitions if transitions else float("nan"))
        # the ranks sample side by side: the run's rate is the sum of theirs
        log("rollout/samples_per_s", self.once(torch.tensor(size / max(sampling_s, 1e-9))), reduce_fx="sum",
            sync_dist=True)
