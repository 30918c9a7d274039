"""Plain functions that the FunctionReward tests name by dotted path."""

import numpy as np


def brightness(images, prompts, metadata, gamma=1.0, offset=0.0):
    """Mean of ``pixel ** gamma`` per image, plus ``offset``: a NumPy array [B]."""
    return images.float().pow(gamma).mean(dim=(1, 2, 3)).cpu().numpy() + offset


def prompt_lengths(images, prompts, metadata):
    """Characters per prompt, as a list."""
    return [float(len(p)) for p in prompts]


def one_score_short(images, prompts, metadata):
    return np.zeros(len(prompts) - 1)
