"""Trainer images (float tensors in ``[0, 1]``) as the 8-bit PIL images that published reward pipelines read.

Published scorers (ImageReward, Flow-GRPO's OCR, VLM judges) take PIL images or PNG files, i.e. 8-bit pixels; a
reward that rounds to 8 bits first scores exactly what those pipelines score on a saved sample.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import Tensor


def to_pil(images: Tensor) -> list[Image.Image]:
    """RGB PIL images for ``images [B, 3, H, W]`` in ``[0, 1]`` (clamped, rounded to 8 bits).

    >>> [img.size for img in to_pil(torch.ones(2, 3, 4, 5))], to_pil(torch.ones(1, 3, 1, 1))[0].getpixel((0, 0))
    ([(5, 4), (5, 4)], (255, 255, 255))
    """
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(np.ascontiguousarray(array)) for array in pixels]
