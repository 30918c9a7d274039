"""KL penalties between the trained policy and a reference: per-position estimators for sampled actions (tokens,
denoising steps) and the exact KL of two Gaussian transition kernels with equal std (SDE policies).

Estimators (J. Schulman, "Approximating KL divergence", 2020; verl ``core_algos.kl_penalty``), with
``d = log_prob - ref_log_prob`` and samples drawn from the trained policy:
``k1 = d``; ``abs = |d|``; ``k2 = d^2 / 2``; ``k3 = exp(-d) + d - 1``, computed as verl does with ``-d`` clamped to
``[-20, 20]`` and the result to ``[-10, 10]`` (TRL's GRPO ``beta`` term is the unclamped k3). A ``+`` suffix
(``k3+``, ``k1+``, ``abs+``) is the straight-through variant of verl-project/verl#6058: the value of the named
estimator, the gradient of k2 (``d grad log_prob``, the unbiased gradient of the KL). verl's names ``kl``, ``mse``
and ``low_var_kl`` are accepted for k1, k2 and k3.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

_FORWARD: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": lambda d: d,
    "abs": lambda d: d.abs(),
    "k2": lambda d: 0.5 * d.square(),
    "k3": lambda d: (torch.exp(-d.clamp(-20.0, 20.0)) + d.clamp(-20.0, 20.0) - 1.0).clamp(-10.0, 10.0),
}
_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
KL_ESTIMATORS = tuple(sorted([*_FORWARD, *(f"{k}+" for k in _FORWARD)]))


def kl(name: str, log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Per-position KL estimate ``[B, T]`` of ``name`` (see the module docstring); aggregate it with the policy loss.

    Raises:
        ValueError: an unknown estimator, naming those available.

    >>> d = torch.log(torch.tensor([2.0]))  # log_prob - ref_log_prob = log 2
    >>> [round(kl(n, d, torch.zeros(1)).item(), 4) for n in ("k1", "k2", "k3", "abs")]  # k3 = 1/2 + log 2 - 1
    [0.6931, 0.2402, 0.1931, 0.6931]
    """
    straight_through = name.endswith("+")
    base = name[:-1] if straight_through else name
    base = _ALIASES.get(base, base)
    if base not in _FORWARD:
        raise ValueError(f"unknown KL estimator {name!r}; available: {list(KL_ESTIMATORS)} "
                         f"(aliases {sorted(_ALIASES)}, with or without '+')")
    d = log_prob - ref_log_prob
    value = _FORWARD[base](d)
    if not straight_through or base == "k2":
        return value
    k2 = _FORWARD["k2"](d)
    return k2 - k2.detach() + value.detach()


def gaussian_mean_kl(mean: Tensor, ref_mean: Tensor, std: Tensor) -> Tensor:
    """KL between two Gaussians of equal std, averaged over dims: ``mean((mu - mu_ref)^2) / (2 std^2)`` ``[B]``.

    With the transition std of a sampler step (``s sqrt(-dt)`` for the Flow-GRPO SDE) this is the exact KL of the two
    transition kernels, the ``exact`` convention of :func:`kl_convention_scale`.

    >>> gaussian_mean_kl(torch.ones(1, 2), torch.zeros(1, 2), torch.full((1, 1), 0.5)).item()
    2.0
    """
    sq = (mean.float() - ref_mean.float()) ** 2 / (2 * std.float() ** 2)
    return sq.flatten(1).mean(dim=1)


#: how a policy's KL to its reference is scaled (``beta`` is in the units of one of them):
#: ``exact`` the Gaussian KL of the two transitions; ``flow_grpo`` as yifan123/flow_grpo scripts/train_sd3.py
KL_CONVENTIONS = ("exact", "flow_grpo")


def kl_convention_scale(convention: str, step_kind: str, sigma: Tensor, sigma_next: Tensor) -> Tensor:
    """The factor ``[...]`` that turns the exact transition KL into ``convention``'s, per step.

    flow_grpo divides the squared mean gap by ``2 std_dev_t^2``, ``std_dev_t`` being what its step returns: for its
    SDE step the coefficient ``s = a sqrt(sigma / (1 - sigma))``, whose transition std is ``s sqrt(|dt|)``, so its
    KL is the exact one times ``|dt| = sigma - sigma_next``; for its CPS step the transition std itself (factor 1).
    Step kinds flow_grpo's code does not have (``dance``, ``ddim``) keep the exact KL. A flow_grpo ``beta`` (0.01 for
    PickScore, 0.04 for GenEval and OCR) means what it meant there under ``flow_grpo``.

    >>> kl_convention_scale("flow_grpo", "flow_grpo", torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.3]))
    tensor([0.1000, 0.2000])
    >>> kl_convention_scale("exact", "flow_grpo", torch.tensor([1.0]), torch.tensor([0.9]))
    tensor([1.])
    """
    if convention not in KL_CONVENTIONS:
        raise ValueError(f"unknown KL convention {convention!r}; choose one of {list(KL_CONVENTIONS)}")
    if convention == "flow_grpo" and step_kind == "flow_grpo":
        return (sigma - sigma_next).abs().float()
    return torch.ones_like(sigma, dtype=torch.float32)
