"""The LAION aesthetic predictor v2 (improved-aesthetic-predictor): an MLP on the unit-norm CLIP ViT-L/14 embedding.

Score, as the authors' ``simple_inference.py`` and DDPO's ``aesthetic_scorer``: ``head(e / |e|)`` with ``e`` the
projected CLIP image embedding; roughly a 1-10 rating (most images land between 4 and 7). The head is the published
``sac+logos+ava1-l14-linearMSE.pth`` (keys ``layers.0.weight`` ... ``layers.7.bias``); the default address is TRL's
hub copy of that file. The head runs in float32 whatever ``dtype`` the CLIP tower uses (it is five tiny layers).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from flowrl.rewards.clip_reward import ClipReward
from flowrl.rewards.hub_file import check_file, fetch_file
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


class AestheticHead(nn.Module):
    """``Linear(D,1024), Dropout(.2), Linear(1024,128), Dropout(.2), Linear(128,64), Dropout(.1), Linear(64,16),
    Linear(16,1)``: the published layout (no activations: the trained head is an affine map), ``[B, D] -> [B]``."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Tensor]) -> "AestheticHead":
        """The head holding ``state_dict`` (input size read from ``layers.0.weight``); every key must match."""
        if "layers.0.weight" not in state_dict:
            raise KeyError(f"not an aesthetic-predictor head: no 'layers.0.weight' among {sorted(state_dict)[:8]}")
        head = cls(state_dict["layers.0.weight"].shape[1])
        head.load_state_dict(state_dict, strict=True)
        return head.eval().requires_grad_(False)

    def forward(self, embeddings: Tensor) -> Tensor:
        return self.layers(embeddings).squeeze(-1)


class Aesthetic(ClipReward):
    """LAION aesthetic score of each image (the prompt is not used).

    Args:
        model: the CLIP the head was trained on, ``openai/clip-vit-large-patch14`` (hub id or local folder).
        head: the head's weights file, local or ``org/repo/filename`` on the hub.
        processor: default ``model``.
    """

    default_name = "aesthetic"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 model: str = "openai/clip-vit-large-patch14",
                 head: str = "trl-lib/ddpo-aesthetic-predictor/aesthetic-model.pth", processor: Optional[str] = None,
                 device: Optional[str] = None, dtype: str = "float32", frames: FrameSpec = DEFAULT_FRAMES,
                 frame_reduction: str = "mean"):
        super().__init__(model, processor, weight, name, batch_size, device, dtype, frames, frame_reduction)
        self.head_file, self.head = check_file(head), None

    def _load(self, model, device, dtype):
        clip = super()._load(model, device, dtype)
        head = AestheticHead.from_state_dict(torch.load(fetch_file(self.head_file), map_location="cpu",
                                                        weights_only=True))
        if head.layers[0].in_features != clip.config.projection_dim:
            raise ValueError(f"aesthetic head {self.head_file!r} takes {head.layers[0].in_features}-d embeddings but "
                             f"{model!r} projects to {clip.config.projection_dim}; use the CLIP it was trained on")
        self.head = head.to(device)
        return clip

    def load(self, device=None) -> "Aesthetic":
        super().load(device)
        self.head.to(self.model_device)
        return self

    def _score(self, images, prompts, metadata) -> Tensor:
        embeddings = self.image_embeddings(images)  # [B, E]; loads the CLIP and the head on first use
        return self.head(embeddings)
