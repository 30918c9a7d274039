"""CLIPScore (Hessel et al. 2021, arXiv 2104.08718) through torchmetrics: ``max(100 * cos(image, prompt), 0)``.

The scale is torchmetrics' (100 x cosine, clamped at 0 per image, so in ``[0, 100]``; the paper's ``w = 2.5``
variant is ``weight: 0.025``). torchmetrics computes the score; this module only feeds it.

Why the wrappers: torchmetrics 1.9.0 divides ``model.get_image_features(...)`` by its norm, and transformers 5
returns an output object there (``AttributeError: 'BaseModelOutputWithPooling' object has no attribute 'norm'``).
:class:`FeatureCLIP` returns the projected ``pooler_output`` instead, and :class:`TensorProcessor` preprocesses the
float ``[0, 1]`` tensors with the processor's settings on the scorer's device (torchmetrics hands images over on
the CPU; the processor would read floats in ``[0, 1]`` as already rescaled).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from flowrl.rewards.clip_reward import ClipReward, projected
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


class FeatureCLIP(nn.Module):
    """A ``CLIPModel`` whose ``get_*_features`` return tensors ``[N, E]`` in float32, as torchmetrics expects."""

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip, self.config = clip, clip.config

    def get_image_features(self, pixel_values: Tensor) -> Tensor:
        return projected(self.clip.get_image_features(pixel_values=pixel_values)).float()

    def get_text_features(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        return projected(self.clip.get_text_features(input_ids=input_ids, attention_mask=attention_mask)).float()


class TensorProcessor:
    """The processor torchmetrics calls: images through the reward's tensor preprocessing, text its tokenizer."""

    def __init__(self, reward: "CLIPScore"):
        self.reward = reward

    def __call__(self, text=None, images=None, **_):
        if images is not None:
            return {"pixel_values": self.reward.pixel_values(torch.stack(list(images)))}
        return self.reward.tokens(text)


class CLIPScore(ClipReward):
    """torchmetrics' CLIPScore of each image against its prompt.

    Args:
        model: a ``CLIPModel`` (hub id or local folder); torchmetrics' default is ``openai/clip-vit-large-patch14``.
        processor: its processor (default: ``model``).
    """

    default_name = "clip_score"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 model: str = "openai/clip-vit-large-patch14", processor: Optional[str] = None,
                 device: Optional[str] = None, dtype: str = "float32", frames: FrameSpec = DEFAULT_FRAMES,
                 frame_reduction: str = "mean"):
        super().__init__(model, processor, weight, name, batch_size, device, dtype, frames, frame_reduction)
        try:  # checked at config time: the two torchmetrics entry points _load and _score use
            from torchmetrics.functional.multimodal.clip_score import _clip_score_update  # noqa: F401
            from torchmetrics.multimodal import CLIPScore as _  # noqa: F401
        except ImportError as error:
            raise ImportError("CLIPScore needs torchmetrics' multimodal CLIPScore with a callable model_name_or_path "
                              "(torchmetrics 1.9 is tested): pip install -U torchmetrics") from error
        self.metric = None

    def _load(self, model, device, dtype):
        from torchmetrics.multimodal import CLIPScore as CLIPScoreMetric

        clip = super()._load(model, device, dtype)
        # torchmetrics' callable form: it takes (model, processor) from us instead of loading by name.
        self.metric = CLIPScoreMetric(model_name_or_path=lambda: (FeatureCLIP(clip), TensorProcessor(self)))
        return clip

    def _score(self, images, prompts, metadata) -> Tensor:
        # The metric's update() sums over the batch; the per-image scores come from the function update() calls.
        from torchmetrics.functional.multimodal.clip_score import _clip_score_update

        device = self.model_device  # loads the weights and builds the metric on first use outside a Trainer
        scores, _ = _clip_score_update(list(images.to(device)), list(prompts), self.metric.model,
                                       self.metric.processor)
        return scores.clamp(min=0)
