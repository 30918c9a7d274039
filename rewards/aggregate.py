"""Combining the scores of several reward callbacks into one reward per sample.

``sum`` (the default): the weighted raw sum ``sum_k w_k r_k``. A sample whose score from any reward is NaN or inf
is marked invalid: it is left out of the group statistics and the loss, and counted in the logs; it is never
turned into a zero reward.
"""

from __future__ import annotations

import torch
from torch import Tensor


def weighted_sum(scores: dict[str, Tensor], weights: dict[str, float]) -> tuple[Tensor, Tensor]:
    """Total reward ``[B]`` and validity ``[B]`` bool; invalid rows hold 0 in the total.

    >>> total, ok = weighted_sum({"a": torch.tensor([1.0, float("nan")]), "b": torch.tensor([2.0, 3.0])},
    ...                          {"a": 1.0, "b": 0.5})
    >>> total.tolist(), ok.tolist()
    ([2.0, 0.0], [True, False])
    """
    if not scores:
        raise ValueError("no reward scores to combine: add a reward callback to trainer.callbacks")
    stacked = torch.stack([scores[name].float() * weights[name] for name in scores])  # [K, B]
    valid = torch.isfinite(stacked).all(dim=0)
    total = torch.where(valid, stacked.sum(dim=0), torch.zeros_like(stacked[0]))
    return total, valid
