"""Temporal consistency of a video: how alike its neighbouring frames are, in pixels.

Each picked frame (``frames``, default ``all``) is average-pooled to ``size x size`` (so that sensor-level noise and
sub-pixel jitter count little and the cost does not grow with the resolution), and the score is
``1 - mean_t mean |f_{t+1} - f_t|`` over neighbouring picked frames: 1 for a still clip, lower the more the picture
changes between frames, in ``[0, 1]`` for pixels in ``[0, 1]``. A flicker or a cut lowers it; so does motion, which
is why it serves as a regulariser beside a reward for what the video should show, weighted against it, not alone.
No weights: it runs anywhere.
"""

from __future__ import annotations

from typing import Any, Optional

import torch  # noqa: F401  (the doctests use it)
import torch.nn.functional as F
from torch import Tensor

from flowrl.rewards.base import RewardCallback
from flowrl.rewards.video_frames import FrameSpec, frame_indices


def neighbour_similarity(clips: Tensor, size: int = 32) -> Tensor:
    """``1 - mean |f_{t+1} - f_t|`` of clips ``[B, F, 3, H, W]`` pooled to ``size`` (F >= 2), ``[B]``.

    >>> still = torch.full((1, 3, 3, 4, 4), 0.5)
    >>> flicker = torch.stack([torch.zeros(3, 4, 4), torch.ones(3, 4, 4), torch.zeros(3, 4, 4)])[None]
    >>> neighbour_similarity(torch.cat([still, flicker]), size=2).tolist()
    [1.0, 0.0]
    """
    b, f = clips.shape[:2]
    pooled = F.adaptive_avg_pool2d(clips.flatten(0, 1).float(), size).view(b, f, -1)  # [B, F, 3 * size * size]
    return 1 - (pooled[:, 1:] - pooled[:, :-1]).abs().mean(dim=(1, 2))


class TemporalConsistency(RewardCallback):
    """Scores whole clips by the similarity of neighbouring frames (see the module docstring).

    Args:
        size: frames are average-pooled to ``size x size`` before comparing.
        frames: the frames compared, neighbours in this selection (default ``all``; ``every_4`` compares frames 4
            apart).
        weight, name, batch_size: as :class:`~flowrl.rewards.RewardCallback` (``batch_size``: clips per chunk).
    """

    default_name = "temporal_consistency"
    takes_clips = True
    min_frames = 2  # neighbours to compare: the CLI refuses it on a policy of single images before loading

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 16, size: int = 32,
                 frames: FrameSpec = "all"):
        super().__init__(weight, name, batch_size, frames)
        if size < 1:
            raise ValueError(f"reward {self.name!r}: size={size} must be >= 1")
        self.size = size

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        picked = frame_indices(self.frames, images.shape[1])
        if len(picked) < 2:
            raise ValueError(f"reward {self.name!r} compares neighbouring frames: it needs clips [B, F, 3, H, W] with "
                             f"at least 2 of them picked (frames={self.frames!r} picks {len(picked)} of "
                             f"{images.shape[1]}); use it with a video policy")
        return neighbour_similarity(images[:, picked], self.size).cpu()
