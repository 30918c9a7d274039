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


def first_digit(images, prompts, metadata):
    """The first digit named in each prompt ("red 3 and blue 7" -> 3.0): known per prompt, whatever the images."""
    return [float(next(c for c in p if c.isdigit())) for p in prompts]


def first_digit_unless_red(images, prompts, metadata):
    """:func:`first_digit`, but NaN for prompts that start with "red" (a reward that fails on some samples)."""
    return [float("nan") if p.startswith("red") else v for p, v in zip(prompts, first_digit(images, prompts, metadata))]
