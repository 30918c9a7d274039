"""The reward-callback contract: a Lightning callback with a ``name``, a ``weight`` and ``score``.

``score(images [B, 3, H, W] in [0, 1], prompts [B], metadata) -> Tensor [B]``. A method finds every
:class:`RewardCallback` on ``trainer.callbacks``, scores each rollout with all of them, logs each, and sums the
weighted scores; swapping a reward is a config edit. Scoring runs in chunks of ``batch_size`` under
``torch.no_grad()``. Models load in ``setup`` on the trainer's device.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from lightning.pytorch import Callback
from torch import Tensor


class RewardCallback(Callback):
    """Base class. Subclasses implement ``_score`` on one chunk; ``score`` chunks, checks shapes and gathers.

    Args:
        weight: multiplies this reward in the total. name: the key in logs (default: the class's ``default_name``).
        batch_size: images scored per chunk.
    """

    default_name = "reward"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: a reward needs at least 1 image per chunk")
        self.weight, self.name, self.batch_size = float(weight), name or self.default_name, batch_size

    @property
    def state_key(self) -> str:
        return f"{type(self).__name__}[name={self.name}]"

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> Tensor:
        """Scores ``[B]`` (float32, on ``images.device``) for images ``[B, 3, H, W]`` in ``[0, 1]``."""
        if images.ndim != 4 or images.shape[1] != 3 or len(prompts) != images.shape[0]:
            raise ValueError(f"reward {self.name!r}: expected images [B, 3, H, W] and B prompts; got "
                             f"{tuple(images.shape)} and {len(prompts)} prompts")
        metadata = metadata or {}
        out = [self._score(images[s:s + self.batch_size], prompts[s:s + self.batch_size], metadata)
               for s in range(0, len(prompts), self.batch_size)]
        return torch.cat(out).float().to(images.device)

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        raise NotImplementedError


def reward_callbacks(callbacks: list[Callback]) -> list[RewardCallback]:
    """The reward callbacks among ``callbacks``, in order; raises if two share a name."""
    rewards = [c for c in callbacks if isinstance(c, RewardCallback)]
    names = [r.name for r in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"two reward callbacks share a name in {names}; set `name` on one of them")
    return rewards
