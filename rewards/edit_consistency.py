"""Edit consistency: how much of the source image an edit keeps outside the region it edits, in pixels.

An instruction edits part of a picture; the rest should come back unchanged (the failure this guards against: an
edit reward alone, such as a judge of the instruction, is satisfied by repainting the whole image). Output and
source (the row's source image ``source_index``, stretched to the output's frame) are average-pooled to a
``size x size`` grid, so that resampling and sub-pixel shifts count little; each cell's change is its mean absolute
difference over the channels. The ``edit_fraction`` of cells that changed most are taken as the edited region and
left out (no mask is needed: an edit may change any region, but only so much of the picture); the score is
``1 - mean change`` of the other cells, in ``[0, 1]``: 1 when the output keeps the source everywhere outside its
most-changed ``edit_fraction``. ``edit_fraction: 0`` scores the whole picture. No weights: it runs anywhere, and it
is the pixel counterpart of flow_grpo's CLIP ``image_similarity`` edit reward
(:class:`~flowrl.rewards.ImageSimilarity`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from flowrl.rewards.base import RewardCallback
from flowrl.rewards.edit_sources import fitted, source_at


def kept_similarity(outputs: Tensor, sources: Tensor, size: int = 32, edit_fraction: float = 0.25) -> Tensor:
    """``1 - mean change`` of the ``1 - edit_fraction`` least-changed cells of a ``size x size`` grid ``[B]``;
    ``outputs`` and ``sources`` ``[B, 3, H, W]`` in ``[0, 1]``.

    >>> source = torch.zeros(2, 3, 4, 4)
    >>> edited = source.clone(); edited[0, :, :2] = 1.0; edited[1] = 0.5  # row 0: top half edited; row 1: all greyed
    >>> kept_similarity(edited, source, size=2, edit_fraction=0.5).tolist()  # row 0 keeps its bottom half
    [1.0, 0.5]
    >>> kept_similarity(edited, source, size=2, edit_fraction=0.0).tolist()  # the whole picture
    [0.5, 0.5]
    """
    cells = size * size
    change = (F.adaptive_avg_pool2d(outputs.float(), size) - F.adaptive_avg_pool2d(sources.float(), size))
    change = change.abs().mean(1).flatten(1)  # [B, size * size]
    kept = max(1, cells - round(edit_fraction * cells))
    return 1 - change.sort(dim=1).values[:, :kept].mean(1)


class EditConsistency(RewardCallback):
    """Scores each edit by how much of its source it keeps outside the edited region (see the module docstring).

    Args:
        size: output and source are average-pooled to ``size x size`` before comparing.
        edit_fraction: the share of the grid, the most changed cells, left out as the edited region (0 to 1).
        source_index: which of a record's source images to compare with (0: the first; -1: the last).
        weight, name, batch_size: as :class:`~flowrl.rewards.RewardCallback`.
    """

    default_name = "edit_consistency"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64, size: int = 32,
                 edit_fraction: float = 0.25, source_index: int = 0):
        super().__init__(weight, name, batch_size)
        problems = []
        if size < 1:
            problems.append(f"size={size} must be >= 1")
        if not 0 <= edit_fraction < 1:
            problems.append(f"edit_fraction={edit_fraction} must be in [0, 1) (the share of the picture an edit "
                            "may change; 0: compare everywhere)")
        if problems:
            raise ValueError(f"reward {self.name!r}: " + "; ".join(problems))
        self.size, self.edit_fraction, self.source_index = size, edit_fraction, source_index

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        if images.ndim != 4:
            raise ValueError(f"reward {self.name!r} scores edited images [B, 3, H, W], not videos")
        picked = source_at(metadata, len(images), self.name, self.source_index)
        frame = tuple(images.shape[-2:])
        sources = torch.stack([fitted(s.to(images.device), frame) for s in picked])
        return kept_similarity(images, sources, self.size, self.edit_fraction).cpu()
