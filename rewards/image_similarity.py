"""CLIP image similarity of an edit to its source: flow_grpo's ``image_similarity`` edit reward
(``flow_grpo/rewards.py::image_similarity_score`` and ``clip_scorer.py::ClipScorer.image_similarity``: the cosine of
the unit-norm CLIP ViT-L/14 image embeddings of the output and the reference image), weighted 0.5 in flow_grpo's
FLUX.1 Kontext recipe and 0.2 in its Qwen-Image-Edit ones, beside an instruction reward.

The source is the row's source image ``source_index`` (see :mod:`flowrl.rewards.edit_sources`), preprocessed on its
own (sources keep their sizes) with the CLIP processor's settings, as the output is. Scores are cosines in
``[-1, 1]`` (1: the same picture to CLIP). Unlike :class:`~flowrl.rewards.EditConsistency` it rewards keeping the
source's content and style rather than its pixels, and does not single out an edited region.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.rewards.clip_reward import ClipReward
from flowrl.rewards.edit_sources import source_at


class ImageSimilarity(ClipReward):
    """Cosine of the CLIP image embeddings of each edit and its source.

    Args:
        model: a ``CLIPModel`` (hub id or local folder); flow_grpo's: ``openai/clip-vit-large-patch14``.
        processor: its processor (default: ``model``).
        source_index: which of a record's source images to compare with (0: the first; -1: the last).
        weight, name, batch_size, device, dtype: as :class:`~flowrl.rewards.base.ModelReward`.
    """

    default_name = "image_similarity"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 model: str = "openai/clip-vit-large-patch14", processor: Optional[str] = None,
                 device: Optional[str] = None, dtype: str = "float32", source_index: int = 0):
        super().__init__(model, processor, weight, name, batch_size, device, dtype)
        self.source_index = source_index

    def _load_clip(self, model: str, dtype):
        from transformers import CLIPModel

        return CLIPModel.from_pretrained(model, dtype=dtype)

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        if images.ndim != 4:
            raise ValueError(f"reward {self.name!r} scores edited images [B, 3, H, W], not videos")
        picked = source_at(metadata, len(images), self.name, self.source_index)
        outputs = self.image_embeddings(images)  # [B, E] unit norm
        sources = torch.cat([self.image_embeddings(source[None]) for source in picked])  # each at its own size
        return (outputs * sources).sum(-1).cpu()
