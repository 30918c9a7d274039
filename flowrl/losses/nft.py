"""DiffusionNFT's negative-aware loss on the forward process (arXiv 2509.16117, Eq. 8-10), as the authors' code
computes it (NVlabs/DiffusionNFT ``scripts/train_nft_sd3.py``, ``main``'s training loop, and ``return_decay``).

From the sampling ("old") velocity ``v_old`` and the trained one ``v`` at a noised clean sample
``x_t = (1 - t) x0 + t eps``, strength ``beta`` defines an implicit positive and an implicit negative policy:

    v+ = beta v + (1 - beta) v_old        v- = (1 + beta) v_old - beta v

Each is regressed onto the clean sample in x0 space (``x0± = x_t - t v±``), divided by its detached mean absolute
error; the reward enters as an optimality probability ``r = clamp(clip(A, c) / c / 2 + 1/2, 0, 1)``:

    loss = c (r L+ + (1 - r) L-) / beta,     L± = mean((x0± - x0)^2) / mean|x0± - x0|

Notation: B rows, D latent dimensions (means over D are per row); ``t`` a row's noise level; ``c`` the advantage
clip (5).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: DiffusionNFT ``adv_mode`` values: how clipped advantages are reshaped before the optimality mapping.
ADVANTAGE_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")


def optimality_probability(advantages: Tensor, clip: float = 5.0, mode: str = "all") -> Tensor:
    """``r [B]`` in [0, 1]: the advantage clipped to ``[-clip, clip]``, reshaped by ``mode`` (``positive_only`` /
    ``negative_only`` zero the other side, ``one_only`` maps positives to 1 and the rest to 0, ``binary`` takes the
    sign), then ``A / clip / 2 + 1/2``.

    Raises:
        ValueError: an unknown mode, naming those available.

    >>> optimality_probability(torch.tensor([2.5, -7.0, 0.0])).tolist()  # 2.5/5/2 + .5; -5 -> 0; 0 -> one half
    [0.75, 0.0, 0.5]
    >>> optimality_probability(torch.tensor([2.5, -2.5]), mode="binary").tolist()  # sign: +-1 -> 0.6, 0.4
    [0.6000000238418579, 0.4000000059604645]
    """
    a = advantages.clamp(-clip, clip)
    if mode == "positive_only":
        a = a.clamp(0, clip)
    elif mode == "negative_only":
        a = a.clamp(-clip, 0)
    elif mode == "one_only":
        a = (a > 0).to(a.dtype)
    elif mode == "binary":
        a = torch.sign(a)
    elif mode != "all":
        raise ValueError(f"unknown advantage mode {mode!r}; choose one of {list(ADVANTAGE_MODES)}")
    return (a / clip / 2.0 + 0.5).clamp(0, 1)


def _regression(x0_hat: Tensor, x0: Tensor, floor: float) -> Tensor:
    """``mean((x0_hat - x0)^2 / w)`` per row, ``w = max(mean|x0_hat - x0|, floor)`` detached (double, as the code)."""
    dims = tuple(range(1, x0.dim()))
    with torch.no_grad():
        w = (x0_hat.double() - x0.double()).abs().mean(dim=dims, keepdim=True).clamp(min=floor)
    return ((x0_hat - x0).square() / w).mean(dim=dims)


def nft_loss(v: Tensor, v_old: Tensor, x_t: Tensor, x0: Tensor, t: Tensor, r: Tensor, beta: float = 1.0,
             clip: float = 5.0, floor: float = 1e-5) -> Tensor:
    """DiffusionNFT's per-row policy loss ``[B]`` (see the module docstring).

    Args:
        v: ``[B, ...]`` the trained velocity (with gradient). v_old: ``[B, ...]`` the sampling policy's (detached).
        x_t, x0: ``[B, ...]`` the noised and the clean sample. t: ``[B]`` noise levels. r: ``[B]`` optimality
            probabilities (:func:`optimality_probability`). beta: the implicit policies' strength (> 0).
        clip: the advantage clip the loss is multiplied by. floor: the smallest error weight.

    >>> one = lambda value: torch.tensor([[value]])
    >>> round(nft_loss(one(0.4), one(0.2), one(0.2), one(0.5), torch.tensor([0.5]), torch.tensor([0.75])).item(), 6)
    2.25
    """
    v_old = v_old.detach()
    t = t.reshape(-1, *([1] * (x0.dim() - 1))).to(v.dtype)
    positive = beta * v + (1 - beta) * v_old
    negative = (1 + beta) * v_old - beta * v
    loss_pos = _regression(x_t - t * positive, x0, floor)
    loss_neg = _regression(x_t - t * negative, x0, floor)
    return clip * (r * loss_pos + (1 - r) * loss_neg) / beta


def old_decay(step: int, delay: int = 0, rate: float = 0.001, limit: float = 0.5) -> float:
    """The decay of the soft update ``old <- decay old + (1 - decay) current`` after ``step`` optimizer steps: 0 before
    ``delay``, then ``min((step - delay) rate, limit)`` (DiffusionNFT ``return_decay``: type 1 is the default
    ``(0, 0.001, 0.5)``, type 2 ``(75, 0.0075, 0.999)``, type 0 ``(0, 0, 0)``: the old policy is the current one).

    >>> old_decay(100), old_decay(1000), old_decay(50, 75, 0.0075, 0.999), old_decay(175, 75, 0.0075, 0.999)
    (0.1, 0.5, 0.0, 0.75)
    """
    if step < delay:
        return 0.0
    return min((step - delay) * rate, limit)
