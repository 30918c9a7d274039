"""Entropy of a categorical policy from its logits (the entropy bonus of LLM RL)."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """``H = logsumexp(z) - sum_v softmax(z)_v z_v`` over the last dim: ``[..., V] -> [...]``.

    As verl ``verl/utils/torch_functional.py::entropy_from_logits``: the identity
    ``-sum p log p = logsumexp(z) - sum p z`` never takes the log of a probability, so it stays finite where a
    softmax underflows to 0.

    >>> round(entropy_from_logits(torch.zeros(4)).item(), 4)  # uniform over 4: log 4
    1.3863
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
