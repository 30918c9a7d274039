"""Where an SDE window lies over training: the window's first step as a pure function of the iteration.

A window method samples with the SDE on the steps ``[w, w + S)`` and the ODE elsewhere, and trains only the window
(MixGRPO, arXiv 2507.21802; Dynamic-TreeRPO, arXiv 2509.23352). The start ``w`` moves over training by one of two
strategies, each a function of the iteration count alone so a resumed run (or every rank) agrees:

- ``progressive``: ``w`` starts at ``start`` and moves by ``stride`` every ``every`` iterations; past ``last`` it
  rolls back to ``start`` (``roll_back``) or stays at ``last``. MixGRPO's ``GRPOTrainingStates`` with
  ``prog_overlap`` (``Tencent-Hunyuan/MixGRPO`` ``fastvideo/utils/grpo_states.py``, ``update_iteration``): its window
  is read before the update, so iteration ``i`` sees ``w`` after ``i`` updates.
- ``random``: ``w`` drawn uniformly in ``[low, high]`` from a generator seeded by ``(seed, iteration)``. MixGRPO's
  ``random`` strategy draws ``np.random.default_rng(seed).integers(0, max_timesteps - group_size + 1)`` after each
  iteration (so its first iteration keeps ``start``); its script passes no seed, which flowrl does not copy.

:func:`window_steps` is the window's steps given its start; MixGRPO clips the window's end at ``T - 2``
(``max_timesteps = sampling_steps - 2``), so its windows shrink near the end and are empty at ``w = T - 2``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

WINDOW_STRATEGIES = ("progressive", "random")


def progressive_start(iteration: int, *, start: int, every: int, last: int, stride: int = 1,
                      roll_back: bool = True) -> int:
    """The window's first step at ``iteration`` (0-based): ``start + stride * (iteration // every)``, rolled back to
    ``start`` past ``last`` or clipped at ``last``.

    >>> [progressive_start(i, start=0, every=2, last=3) for i in range(10)]  # 0..3, then back to 0
    [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    >>> [progressive_start(i, start=0, every=1, last=5, stride=2, roll_back=False) for i in range(5)]
    [0, 2, 4, 5, 5]
    """
    if iteration < 0 or every < 1 or stride < 1 or last < start:
        raise ValueError(f"progressive_start(iteration={iteration}, start={start}, every={every}, last={last}, "
                         f"stride={stride}): needs iteration >= 0, every >= 1, stride >= 1 and start <= last")
    moves = iteration // every
    if roll_back:
        return start + stride * (moves % ((last - start) // stride + 1))
    return min(start + stride * moves, last)


def random_start(iteration: int, *, low: int, high: int, seed: int) -> int:
    """A window start drawn uniformly in ``[low, high]`` by ``np.random.default_rng([seed, iteration])``: the
    same on every rank and after a resume.

    >>> random_start(3, low=0, high=4, seed=7) == int(np.random.default_rng([7, 3]).integers(0, 5))
    True
    """
    if iteration < 0 or not 0 <= low <= high:
        raise ValueError(f"random_start(iteration={iteration}, low={low}, high={high}): needs iteration >= 0 and "
                         "0 <= low <= high")
    return int(np.random.default_rng([seed, iteration]).integers(low, high + 1))


def window_steps(start: int, size: int, end: int) -> list[int]:
    """The window's steps ``range(start, min(start + size, end))`` (MixGRPO's ``get_current_timesteps``).

    >>> window_steps(21, 4, 23), window_steps(23, 4, 23)
    ([21, 22], [])
    """
    return list(range(start, min(start + size, end)))


def window_mask(iteration: int, *, num_steps: int, size: int, strategy: str = "progressive", every: int = 25,
                low: int = 0, high: int | None = None, seed: int = 0) -> Tensor:
    """The SDE steps ``[T]`` bool at ``iteration``: a window of ``size`` steps inside ``[low, high)`` (default
    ``high = T - 2``, MixGRPO's ``max_timesteps``), ``progressive`` (one step every ``every`` iterations from ``low``,
    back to ``low`` after the start ``high - 1``: the authors' empty window at ``w = high`` is skipped) or ``random``
    (a start in ``[low, high - size]``).

    >>> [window_mask(i, num_steps=6, size=2, every=1).nonzero().flatten().tolist() for i in range(5)]  # high = 4
    [[0, 1], [1, 2], [2, 3], [3], [0, 1]]
    """
    high = num_steps - 2 if high is None else high
    if strategy not in WINDOW_STRATEGIES or not 0 <= low < high <= num_steps or size < 1:
        raise ValueError(f"window_mask(strategy={strategy!r}, low={low}, high={high}, size={size}): needs a strategy "
                         f"in {list(WINDOW_STRATEGIES)}, 0 <= low < high <= T = {num_steps} and size >= 1")
    if strategy == "progressive":
        start = progressive_start(iteration, start=low, every=every, last=high - 1)
    else:
        start = random_start(iteration, low=low, high=max(high - size, low), seed=seed)
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[window_steps(start, size, high)] = True
    return mask
