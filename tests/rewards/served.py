"""Rewards the server tests serve: the mean pixel value, optionally after a delay (a slow reward model), for one
image size only (a model that takes 16x16 images), or failing on a prompt the way a broken reward does."""

import time
from typing import Optional

from flowrl.rewards import RewardCallback


class MeanPixel(RewardCallback):
    """Mean pixel value. ``size``: the only image size it takes (others raise ``ValueError``: the input's fault).
    ``crash_on``: a prompt on which it raises ``RuntimeError`` (the reward's fault)."""

    default_name = "mean_pixel"

    def __init__(self, delay: float = 0.0, size: Optional[int] = None, crash_on: Optional[str] = None, **kwargs):
        super().__init__(**kwargs)
        self.delay, self.size, self.crash_on = delay, size, crash_on

    def _score(self, images, prompts, metadata):
        time.sleep(self.delay)
        if self.size is not None and tuple(images.shape[2:]) != (self.size, self.size):
            raise ValueError(f"this model takes {self.size}x{self.size} images; got "
                             f"{images.shape[2]}x{images.shape[3]}")
        if self.crash_on is not None and self.crash_on in prompts:
            raise RuntimeError("the scorer crashed (CUDA error: an illegal memory access was encountered)")
        return images.float().mean(dim=(1, 2, 3))


def mean_or_words(images, prompts, metadata):
    """A FunctionReward that returns words instead of numbers when a prompt says "words"."""
    if "words" in prompts:
        return ["high"] * len(prompts)
    return images.float().mean(dim=(1, 2, 3))
