"""Which frames of a video an image reward scores, and how their scores become the clip's.

An image reward given videos ``[B, F, 3, H, W]`` scores the frames that ``frames`` picks from each clip as images and
reduces each clip's frame scores with ``frame_reduction``:

- ``frames``: ``first_middle_last`` (the default: frames ``0``, ``(F - 1) // 2`` and ``F - 1``, each once: a third of
  the cost of ``all`` at 81 frames and still the clip's start, middle and end), ``all``, ``first``, ``middle``,
  ``last``, ``every_<k>`` (frames ``0, k, 2k, ...``: flow_grpo's video OCR scores ``every_4``), or a list of frame
  indices (negative ones count from the end);
- ``frame_reduction``: ``mean`` (the default) or ``min`` (the worst frame). A frame the reward cannot score (NaN)
  makes its clip's score NaN: the sample is invalid, never silently scored on the other frames.
"""

from __future__ import annotations

import re
from typing import Optional, Union

import torch  # noqa: F401  (the doctests use it)
from torch import Tensor

#: a frame selection: a name or explicit frame indices
FrameSpec = Union[str, list[int]]
DEFAULT_FRAMES = "first_middle_last"
NAMED = ("first_middle_last", "all", "first", "middle", "last")
REDUCTIONS = {"mean": lambda s: s.mean(dim=1), "min": lambda s: s.min(dim=1).values}


def frames_problem(frames: FrameSpec, frame_reduction: str = "mean") -> Optional[str]:
    """Why a frame selection or reduction is not one, or None.

    >>> frames_problem("every_0"), frames_problem([0, -1], "max")  # doctest: +NORMALIZE_WHITESPACE
    ("frames='every_0': choose first_middle_last, all, first, middle, last, every_<k> with k >= 1 or a list of
      frame indices", "frame_reduction='max': choose one of ['mean', 'min']")
    """
    if frame_reduction not in REDUCTIONS:
        return f"frame_reduction={frame_reduction!r}: choose one of {sorted(REDUCTIONS)}"
    if isinstance(frames, (list, tuple)):
        return None if frames and all(isinstance(i, int) for i in frames) else (
            f"frames={frames!r}: a list of frame indices needs at least one integer")
    match = re.fullmatch(r"every_(\d+)", str(frames))
    if frames in NAMED or (match and int(match.group(1)) >= 1):
        return None
    return (f"frames={frames!r}: choose {', '.join(NAMED)}, every_<k> with k >= 1 or a list of frame indices")


def frame_indices(frames: FrameSpec, num_frames: int) -> list[int]:
    """The frames of a clip of ``num_frames`` that ``frames`` picks, in order, each once.

    >>> frame_indices("first_middle_last", 9), frame_indices("first_middle_last", 2), frame_indices("every_4", 9)
    ([0, 4, 8], [0, 1], [0, 4, 8])
    >>> frame_indices([0, -1], 5), frame_indices("middle", 4)
    ([0, 4], [1])

    Raises:
        ValueError: an index outside the clip.
    """
    last = num_frames - 1
    if isinstance(frames, (list, tuple)):
        if bad := [i for i in frames if not -num_frames <= i < num_frames]:
            raise ValueError(f"frames={list(frames)}: indices {bad} are outside a clip of {num_frames} frames")
        picked = [i % num_frames for i in frames]
    elif frames.startswith("every_"):
        picked = list(range(0, num_frames, int(frames[len("every_"):])))
    else:
        picked = {"first_middle_last": [0, last // 2, last], "all": list(range(num_frames)), "first": [0],
                  "middle": [last // 2], "last": [last]}[frames]
    return list(dict.fromkeys(picked))


def reduce_frames(scores: Tensor, frame_reduction: str = "mean") -> Tensor:
    """Each clip's score ``[B]`` from its frames' scores ``[B, k]`` (NaN stays NaN).

    >>> reduce_frames(torch.tensor([[1.0, 2.0, 6.0], [0.5, float("nan"), 1.0]]))
    tensor([3., nan])
    >>> reduce_frames(torch.tensor([[1.0, 2.0, 6.0]]), "min")
    tensor([1.])
    """
    return REDUCTIONS[frame_reduction](scores)
