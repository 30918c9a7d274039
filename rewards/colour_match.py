"""A held-out check of the embedded digit task that reads pixels, not the classifier: how much of each half's ink is
in the colour its prompt names.

``colour_match(images, prompts, metadata) -> [B]`` in [0, 1] (use it through
:class:`~flowrl.rewards.FunctionReward`): for the left and the right half of a 16x16 canvas, the share of the half's
summed intensity that lies in the channel of the prompt's colour (red, green, blue), averaged over the halves. A
canvas drawn in the right colours on black scores near 1; a blank half scores 0 there; a policy that brightens the
whole canvas, or paints in the wrong colour, scores near 1/3 or below. It shares no weights with
:class:`~flowrl.rewards.DigitAlignment`, so a policy that fools the classifier does not fool it for free.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.digit_canvas import COLOR_NAMES, parse_prompt


def colour_match(images: Tensor, prompts: list[str], metadata: dict) -> Tensor:
    """The mean over the two halves of ``ink in the named colour / all ink`` ``[B]``.

    A red left half and a blue right half, asked for red and blue, then for green and blue:

    >>> canvas = torch.zeros(1, 3, 16, 16); canvas[0, 0, :, :8] = 1; canvas[0, 2, :, 8:] = 1
    >>> colour_match(canvas, ["red 3 and blue 7"], {}), colour_match(canvas, ["green 3 and blue 7"], {})
    (tensor([1.]), tensor([0.5000]))

    Raises:
        ValueError: a prompt outside the task's grammar (``predict`` and ``evaluate`` score it NaN).
    """
    specs = [parse_prompt(p) for p in prompts]
    width = images.shape[-1] // 2
    halves = []
    for side, cols in (("left", slice(0, width)), ("right", slice(width, None))):
        ink = images[..., cols].float().sum(dim=(2, 3))  # [B, 3]
        wanted = torch.tensor([COLOR_NAMES.index(getattr(s, f"{side}_color")) for s in specs], device=images.device)
        halves.append(ink.gather(1, wanted[:, None]).squeeze(1) / ink.sum(1).clamp_min(1e-6))  # a blank half: 0
    return (halves[0] + halves[1]) / 2
