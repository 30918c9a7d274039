"""The hooks' defaults, on the batch gathered from every rank (:meth:`~flowrl.methods.base.BaseModule.apply_hooks`
calls them in order): a trajectory's outcome on its last trained step, the estimator's advantages within each
prompt's group, every step weighted 1, no likelihood term. :class:`~flowrl.methods.base.BaseModule` takes them as its
methods; a method overrides any of them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from flowrl import advantages as adv_lib
from flowrl.methods.batch import Batch


def step_rewards(self: Any, batch: Batch):
    """Rewards ``[B, T]`` for the estimator: the outcome on each row's last trained step."""
    rewards = torch.zeros_like(batch.log_probs)
    last = batch.train_mask.float().cumsum(1).argmax(1)  # [B] last trained position
    rewards[torch.arange(len(batch.total)), last] = batch.total
    return rewards


def advantages(self: Any, batch: Batch):
    """Advantages ``[B, T]`` of the valid rows (0 elsewhere). A tree estimator gets the rollout's ``node_ids``
    as its ``step_group_ids``."""
    valid = batch.valid
    extra = {} if batch.node_ids is None else {"step_group_ids": batch.node_ids[valid]}  # read by `tree`
    out = torch.zeros_like(batch.step_rewards)
    out[valid] = adv_lib.compute(self.advantage, batch.step_rewards[valid], batch.train_mask[valid],
                                 self.advantage_groups(batch)[valid], log_probs=batch.log_probs[valid],
                                 **(self.advantage_options or {}), **extra)
    return out


def advantage_groups(self: Any, batch: Batch) -> Tensor:
    """The group id of each row, among which advantages are normalised (default: the prompt's group)."""
    return batch.group_ids


def loss_weights(self: Any, batch: Batch):
    """Per (row, step) loss weights ``[B, T]`` (the loop zeroes the rows without a valid reward)."""
    return torch.ones_like(batch.log_probs)


def supervised_weights(self: Any, batch: Batch):
    """Weights ``[B, T]`` of a likelihood term ``-w log p`` beside the policy loss (None: none; Dynamic-TreeRPO's
    LayerTuning-RL declares one)."""
    return None
