"""Rewards the server tests serve: the mean pixel value, optionally after a delay (a slow reward model)."""

import time

from flowrl.rewards import RewardCallback


class MeanPixel(RewardCallback):
    default_name = "mean_pixel"

    def __init__(self, delay: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.delay = delay

    def _score(self, images, prompts, metadata):
        time.sleep(self.delay)
        return images.float().mean(dim=(1, 2, 3))
