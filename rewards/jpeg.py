"""JPEG (in)compressibility, the DDPO classic (arXiv 2305.13301): the size of the image saved as JPEG.

Sign and scale: ``JpegCompressibility`` scores ``-size_kB`` and ``JpegIncompressibility`` ``+size_kB`` at quality
95, as DDPO's ``jpeg_compressibility`` / ``jpeg_incompressibility``; ``scale`` divides the size first (Flow-GRPO
reports the same kB values). No weights; pure PIL.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from flowrl.rewards.base import RewardCallback
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


def jpeg_size_kb(images: Tensor, quality: int = 95) -> Tensor:
    """JPEG file size in kB (1000 bytes) of each image ``[B, 3, H, W]`` in ``[0, 1]``; ``[B]``."""
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegCompressibility(RewardCallback):
    """``-size_kB / scale``: smaller files score higher."""

    default_name = "jpeg_compressibility"
    sign = -1.0

    def __init__(self, weight: float = 1.0, name: str | None = None, batch_size: int = 64, quality: int = 95,
                 scale: float = 1.0, frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        super().__init__(weight, name, batch_size, frames, frame_reduction)
        if not 1 <= quality <= 100 or scale <= 0:
            raise ValueError(f"quality={quality} must be in 1..100 and scale={scale} positive")
        self.quality, self.scale = quality, scale

    def _score(self, images, prompts, metadata) -> Tensor:
        return self.sign * jpeg_size_kb(images, self.quality) / self.scale


class JpegIncompressibility(JpegCompressibility):
    """``+size_kB / scale``: larger files score higher."""

    default_name = "jpeg_incompressibility"
    sign = 1.0
