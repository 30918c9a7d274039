"""PickScore (Kirstain et al. 2023, arXiv 2305.01569): a CLIP ViT-H/14 fine-tuned on Pick-a-Pic preferences.

Score, as the authors' reference code: ``logit_scale.exp() * cos(image_embedding, text_embedding)``, the scaled
logit of the preference model (about 100 x cosine; typical images score near 20-23). Flow-GRPO trains on
``score / 26``: set ``weight: 0.03846`` (1/26) to reproduce that scale.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from flowrl.rewards.clip_reward import ClipReward
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


class PickScore(ClipReward):
    """PickScore of each image against its prompt.

    Args:
        model: the PickScore ``CLIPModel`` (hub id or local folder).
        processor: its processor; the authors use the base model's, ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``.
    """

    default_name = "pickscore"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 model: str = "yuvalkirstain/PickScore_v1",
                 processor: Optional[str] = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                 device: Optional[str] = None, dtype: str = "float32", frames: FrameSpec = DEFAULT_FRAMES,
                 frame_reduction: str = "mean"):
        super().__init__(model, processor, weight, name, batch_size, device, dtype, frames, frame_reduction)

    def _score(self, images, prompts, metadata) -> Tensor:
        cosine = (self.image_embeddings(images) * self.text_embeddings(prompts)).sum(-1)  # [B]
        return self.model.logit_scale.exp().float() * cosine
