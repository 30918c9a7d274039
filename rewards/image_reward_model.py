"""ImageReward-v1.0 (Xu et al., arXiv 2304.05977) on transformers' BLIP classes.

The published model (``THUDM/ImageReward``, ``ImageReward/ImageReward.py``): a BLIP ViT-L/16 image encoder, a BERT
text encoder whose every layer cross-attends to the image tokens (BLIP's ``text_encoder`` in its multimodal mode),
and an MLP head on the text encoder's first ([CLS]) output token, ``768 -> 1024 -> 128 -> 64 -> 16 -> 1`` with no
activations between the layers (the published ReLUs are commented out; its dropouts are inert at inference). The
head's output ``r`` is standardised with the published mean and std of rewards: ``(r - 0.16717) / 1.03334``.

Here the image encoder is :class:`~transformers.BlipVisionModel` (its ``last_hidden_state`` equals BLIP's ViT
output after the final norm), the text encoder :class:`~transformers.BlipTextModel` without pooler, run as an
encoder (``is_decoder=False``: bidirectional self-attention) with the image tokens as ``encoder_hidden_states``.
The published weights map onto these modules by ``flowrl.rewards.image_reward_checkpoint``.

Preprocessing, as published (``_transform(224)`` of torchvision): resize the shorter side to 224 (bicubic, on the
8-bit PIL image), center crop 224 x 224, scale to [0, 1], normalise with CLIP's mean and std. transformers'
``CLIPImageProcessor`` does all of this but centres the crop with ``//`` where torchvision rounds, which moves the
crop by a pixel for some non-square sizes, so the few PIL lines live here.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn
from transformers import BlipConfig, BlipTextModel, BlipVisionModel
from transformers.models.blip.modeling_blip import BlipPreTrainedModel

REWARD_MEAN = 0.16717362830052426  # published ImageReward.py: self.mean
REWARD_STD = 1.0333394966054072  # published ImageReward.py: self.std
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PROMPT_TOKENS = 35  # published: tokenizer(..., padding="max_length", truncation=True, max_length=35)
HEAD_WIDTHS = (1024, 128, 64, 16, 1)


def standardise(raw: Tensor) -> Tensor:
    """The published standardisation of the head's output: ``(r - 0.16717...) / 1.03334...``.

    >>> standardise(torch.tensor([REWARD_MEAN, REWARD_MEAN + REWARD_STD], dtype=torch.float64)).tolist()
    [0.0, 1.0]
    """
    return (raw - REWARD_MEAN) / REWARD_STD


def preprocess(images: list[Image.Image], size: int = 224) -> Tensor:
    """Published preprocessing: ``[B, 3, size, size]`` float32, CLIP-normalised.

    Resize so the shorter side is ``size`` (the longer side truncated, as torchvision), bicubic; center crop
    with torchvision's rounded offsets; ``/ 255``; ``(x - mean) / std``.
    """
    mean, std = np.array(CLIP_MEAN, dtype=np.float32), np.array(CLIP_STD, dtype=np.float32)
    out = []
    for image in images:
        image = image.convert("RGB")
        w, h = image.size
        scale_w, scale_h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        if (scale_w, scale_h) != (w, h):
            image = image.resize((scale_w, scale_h), Image.BICUBIC)
        top, left = int(round((scale_h - size) / 2.0)), int(round((scale_w - size) / 2.0))
        pixels = np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.float32) / 255
        out.append(torch.from_numpy(((pixels - mean) / std).transpose(2, 0, 1).copy()))
    return torch.stack(out)


class ImageRewardModel(BlipPreTrainedModel):
    """BLIP image encoder + cross-attending text encoder + the ImageReward MLP head.

    ``forward(pixel_values [B, 3, S, S], input_ids [B, L], attention_mask [B, L]) -> raw head output [B]``
    (float32; :func:`standardise` gives the published score).
    """

    config_class = BlipConfig
    main_input_name = "pixel_values"

    def __init__(self, config: BlipConfig):
        super().__init__(config)
        self.vision_model = BlipVisionModel(config.vision_config)
        self.text_encoder = BlipTextModel(config.text_config, add_pooling_layer=False)
        widths = (config.text_config.hidden_size, *HEAD_WIDTHS)
        # the published nn.Sequential layout: Linear, Dropout(0.2), Linear, Dropout(0.2), Linear, Dropout(0.1),
        # Linear, Linear; kept so checkpoint indices (mlp.layers.0/2/4/6/7) map one to one
        dropouts = (0.2, 0.2, 0.1, None)
        layers = []
        for i, p in enumerate(dropouts):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if p is not None:
                layers.append(nn.Dropout(p))
        layers.append(nn.Linear(widths[-2], widths[-1]))
        self.mlp = nn.Sequential(*layers)
        self.post_init()

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        dtype = self.vision_model.embeddings.patch_embedding.weight.dtype
        image_embeds = self.vision_model(pixel_values=pixel_values.to(dtype)).last_hidden_state  # [B, N + 1, Dv]
        # the published call passes an all-ones image mask, which is the same as none
        text = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                 encoder_hidden_states=image_embeds, is_decoder=False, use_cache=False)
        features = text.last_hidden_state[:, 0]  # [B, Dt]: the [CLS] token
        return self.mlp(features.to(self.mlp[0].weight.dtype)).squeeze(-1).float()
