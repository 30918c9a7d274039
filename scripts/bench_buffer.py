"""What a rollout's trajectory buffer holds, in bytes, against the float32 states it must hold (``bench_models.py``'s
memory rows)."""

from __future__ import annotations

from dataclasses import fields

import torch

from flowrl.sampling.rollout import Rollout


def buffer_bytes(rollout: Rollout) -> int:
    """Bytes held by the rollout's tensors, each storage once and at its full size (a view of a larger tensor costs
    the larger tensor; an expanded view costs only what it expands)."""
    storages = {}
    for f in fields(rollout):
        value = getattr(rollout, f.name)
        for t in value.values() if isinstance(value, dict) else [value]:
            if torch.is_tensor(t):
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def latent_bytes(batch: int, num_steps: int, latent_shape: tuple[int, ...]) -> int:
    """The float32 states a trajectory buffer must hold: ``B x (T+1) x latent numel x 4``.

    >>> latent_bytes(2, 3, (1, 2, 2))
    128
    """
    return batch * (num_steps + 1) * torch.Size(latent_shape).numel() * 4
