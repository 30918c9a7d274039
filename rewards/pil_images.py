"""Trainer images (float tensors in ``[0, 1]``) as the 8-bit PIL images that published reward pipelines read.

Published scorers (ImageReward, Flow-GRPO's OCR, VLM judges) take PIL images or PNG files, i.e. 8-bit pixels; a
reward that rounds to 8 bits first scores exactly what those pipelines score on a saved sample.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import Tensor


def unit_pixels(image: Image.Image) -> np.ndarray:
    """An opened PIL image's pixels as ``[H, W, 3]`` float32 in ``[0, 1]``, high-bit grayscale scaled, not clipped.

    Pillow's ``convert("RGB")`` clips every value above 255 to white: 16-bit modes (``I;16``, ``I;16B``, and ``I``,
    Pillow's 32-bit integer mode that holds 16-bit PNGs on some versions) are divided by 65535, ``F`` (32-bit float)
    is taken as values in ``[0, 1]`` (as torchvision reads a float image); both are clipped to ``[0, 1]``. Every other
    mode is converted as the pipelines convert it.

    >>> [round(float(v), 4) for v in unit_pixels(Image.fromarray(np.full((1, 2), 20000, np.uint16)))[0, 0]]  # not white
    [0.3052, 0.3052, 0.3052]
    """
    if image.mode.startswith("I") or image.mode == "F":
        scale = 1.0 if image.mode == "F" else 65535.0
        gray = np.clip(np.asarray(image, dtype=np.float64) / scale, 0.0, 1.0).astype(np.float32)
        return np.repeat(gray[..., None], 3, axis=-1)
    return np.asarray(image.convert("RGB"), dtype=np.uint8).astype(np.float32) / 255


def to_pil(images: Tensor) -> list[Image.Image]:
    """RGB PIL images for ``images [B, 3, H, W]`` in ``[0, 1]`` (clamped, rounded to 8 bits).

    >>> [img.size for img in to_pil(torch.ones(2, 3, 4, 5))], to_pil(torch.ones(1, 3, 1, 1))[0].getpixel((0, 0))
    ([(5, 4), (5, 4)], (255, 255, 255))
    """
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(np.ascontiguousarray(array)) for array in pixels]
