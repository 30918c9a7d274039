"""The shared half of every CLIP-backed reward: a transformers ``CLIPModel``, its processor, unit-norm embeddings.

Subclasses (PickScore, HPSv2, CLIPScore, the LAION aesthetic predictor) differ only by the weights they load, the
image layout their pipeline used and the formula on top of the embeddings. Images are preprocessed on the scorer's
device by :class:`~flowrl.rewards.clip_preprocess.ClipPreprocess` (the processor's own settings, replayed on
tensors); prompts go through the processor's tokenizer, truncated to the text tower's context (77 for CLIP).
"""

from __future__ import annotations

from typing import Literal, Optional

import torch.nn.functional as F
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.rewards.base import ModelReward
from flowrl.rewards.clip_preprocess import ClipPreprocess
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


def projected(features) -> Tensor:
    """The projected embedding from ``get_{image,text}_features``.

    transformers 5 returns an output object whose ``pooler_output`` is the projected embedding; 4.x returned the
    tensor itself.
    """
    return features if isinstance(features, Tensor) else features.pooler_output


class ClipReward(ModelReward):
    """A reward on the embeddings of a transformers ``CLIPModel``.

    Args:
        model: hub id or local folder of the ``CLIPModel`` weights.
        processor: hub id or local folder of the processor (tokenizer + image processor); default: ``model``.
        weight, name, batch_size, device, dtype, frames, frame_reduction: as :class:`~flowrl.rewards.base.ModelReward`.
    """

    layout: Literal["crop", "pad"] = "crop"

    def __init__(self, model: str, processor: Optional[str] = None, weight: float = 1.0, name: Optional[str] = None,
                 batch_size: int = 64, device: Optional[str] = None, dtype: str = "float32",
                 frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        super().__init__(self._resolve(model), weight, name, batch_size, device, dtype,  # missing paths fail now
                         frames, frame_reduction)
        self.processor_id = resolve_model(processor) if processor else self.model_id
        self.tokenizer, self.preprocess = None, None

    def _resolve(self, model: str) -> str:
        return resolve_model(model)

    def _load(self, model: str, device, dtype):
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(self.processor_id)
        self.tokenizer = processor.tokenizer
        self.preprocess = ClipPreprocess.from_image_processor(processor.image_processor, self.layout)
        return self._load_clip(model, dtype).eval().requires_grad_(False).to(device, dtype)

    def _load_clip(self, model: str, dtype):
        from transformers import CLIPModel

        return CLIPModel.from_pretrained(model, dtype=dtype)

    def pixel_values(self, images: Tensor) -> Tensor:
        """``[B, 3, H, W]`` in ``[0, 1]`` -> the model's input ``[B, 3, S, S]`` on its device, in its dtype."""
        device = self.model_device  # loads the weights (and the processor) on first use outside a Trainer
        return self.preprocess(images.to(device)).to(self.dtype)

    def tokens(self, prompts: list[str]) -> dict[str, Tensor]:
        """Token ids and attention mask, padded to the longest prompt, truncated to the text context."""
        device = self.model_device  # loads the weights on first use outside a Trainer
        context = self.model.config.text_config.max_position_embeddings
        tokens = self.tokenizer(list(prompts), padding=True, truncation=True, max_length=context, return_tensors="pt")
        return {k: v.to(device) for k, v in tokens.items() if k in ("input_ids", "attention_mask")}

    def image_embeddings(self, images: Tensor) -> Tensor:
        """Unit-norm image embeddings ``[B, E]`` (float32: the norm and the cosine are taken in full precision)."""
        pixels = self.pixel_values(images)
        return F.normalize(projected(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1)

    def image_features(self, images: Tensor) -> Tensor:
        """The unit-norm image embeddings ``[B, E]``: the feature space in which ``python -m flowrl evaluate``
        measures drift and diversity."""
        return self.image_embeddings(images)

    def text_embeddings(self, prompts: list[str]) -> Tensor:
        """Unit-norm text embeddings ``[B, E]`` (float32)."""
        tokens = self.tokens(prompts)
        return F.normalize(projected(self.model.get_text_features(**tokens)).float(), dim=-1)
