"""The policy-loss registry: names, presets, option rules and the one dispatcher :func:`policy_loss`; the losses
themselves register from :mod:`flowrl.losses.policy` (and ``mean_shift``, ``chunks``). The conventions every loss
keeps are in :mod:`flowrl.losses.policy`'s docstring."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import Tensor

PolicyLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]
_LOSSES: dict[str, PolicyLoss] = {}
_SEQUENCE_LEVEL: set[str] = set()
_NEEDS: dict[str, tuple[str, ...]] = {}
#: per-position inputs a loss may declare, and the value a masked position holds (finite, safe to divide by):
#: ``mean_sq_diff`` = mean over latent dims of ``(mu_theta - mu_old)^2`` (with the gradient of ``mu_theta``), ``std``
#: the step's Gaussian std, ``dt`` = ``sigma_k - sigma_{k+1} > 0``.
STEP_INPUTS: dict[str, float] = {"mean_sq_diff": 0.0, "std": 1.0, "dt": 1.0}
#: option -> (accepts(value), what is accepted), checked before any tensor (or weight) is touched.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "clip_low": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "clip_high": (lambda v: v is None or v >= 0, "null (= clip_low) or a number >= 0"),
    "dual_clip": (lambda v: v is None or v > 1, "null (off) or a number > 1 (verl's clip_ratio_c is 3.0)"),
    "tau_pos": (lambda v: v > 0, "a number > 0"),
    "tau_neg": (lambda v: v > 0, "a number > 0"),
    "clip_eta": (lambda v: v is None or v >= 0, "null (off) or a number >= 0"),
    "clip_bounds": (lambda v: v is None or (len(v) == 2 and 0 <= v[0] <= v[1]),
                    "null or [low, high] with 0 <= low <= high"),
    "chunks": (lambda v: v is None or (len(v) > 0 and all(isinstance(c, int) and c >= 1 for c in v)),
               "null (one chunk: gspo) or a list of chunk sizes >= 1"),
    "clip_bounds_scale": (lambda v: v is None or (len(v) == 2 and 0 <= v[0] <= v[1]),
                          "null or [low, high] multiples of the clip range with 0 <= low <= high"),
    "kl_threshold": (lambda v: v >= 0, "a number >= 0 (UniRL's kl_mask_threshold is 1e-5)"),
    "bias_over": (lambda v: v in ("pair", "step"), "'pair' (the ports) or 'step' (the authors' micro-batch mean)"),
}
#: name@method -> (loss, options): a method's published (or read) clip settings by name; a method names its preset as
#: the default of its ``loss`` option, and a config's ``loss_options`` override single options.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    # Dynamic-TreeRPO Eq. 11 as its reviews describe it: eps(A) = clamp(eps (1 + |A|), eps / 2, 3 eps) [reading]
    "vanilla@tree_rpo": ("vanilla", {"clip_eta": 1.0, "clip_bounds_scale": (0.5, 3.0)}),
    # GCPO xingzhejun/GCPO scripts/finetune/finetune_*_chunk.sh: --new_chunk_list '[2, 3, 4, 7]' over 17 steps, the
    # clip 5e-5 both sides (clip_range sets clip_low; clip_high follows it)
    "chunk_gspo@gcpo": ("chunk_gspo", {"chunks": [2, 3, 4, 7]}),
}


def register_policy_loss(name: str, sequence_level: bool = False,
                         needs: tuple[str, ...] = ()) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator adding a loss under ``name``; ``sequence_level`` losses need every valid position of a row at
    once (their ratio is a function of the whole row); ``needs`` names the :data:`STEP_INPUTS` it takes."""
    if set(needs) - set(STEP_INPUTS):
        raise ValueError(f"policy loss {name!r} needs {sorted(set(needs) - set(STEP_INPUTS))}; known step inputs: "
                         f"{sorted(STEP_INPUTS)}")

    def wrap(fn: PolicyLoss) -> PolicyLoss:
        if name in _LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        _LOSSES[name] = fn
        if sequence_level:
            _SEQUENCE_LEVEL.add(name)
        _NEEDS[name] = tuple(needs)
        return fn

    return wrap


def available_policy_losses() -> list[str]:
    """Every loss and preset name :func:`resolve_policy_loss` accepts."""
    return sorted([*_LOSSES, *PRESETS])


def resolve_policy_loss(name: str, **options: Any) -> tuple[str, dict[str, Any]]:
    """The loss behind ``name`` and its options: a preset's, overridden by ``options``; checked (no tensors needed).

    >>> resolve_policy_loss("vanilla@tree_rpo", clip_low=1e-4)
    ('vanilla', {'clip_eta': 1.0, 'clip_bounds_scale': (0.5, 3.0), 'clip_low': 0.0001})
    """
    base, preset = PRESETS.get(name, (name, {}))
    merged = {**preset, **options}
    check_policy_loss(base, **merged)
    return base, merged


def _get(name: str) -> PolicyLoss:
    if name not in _LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; available: {available_policy_losses()}")
    return _LOSSES[name]


def is_sequence_level(name: str) -> bool:
    """Whether the loss's value at one position depends on the other positions of its row (e.g. ``gspo``)."""
    _get(name)
    return name in _SEQUENCE_LEVEL


def policy_loss_needs(name: str) -> tuple[str, ...]:
    """The per-position :data:`STEP_INPUTS` the loss ``name`` (or preset) takes beside the log-probs.

    >>> policy_loss_needs("vanilla"), policy_loss_needs("dppo")
    ((), ('mean_sq_diff', 'std'))
    """
    base = PRESETS[name][0] if name in PRESETS else name
    _get(base)  # unknown names fail with the list of known ones
    return _NEEDS[base]


def policy_loss_options(name: str) -> dict[str, Any]:
    """The options a loss accepts, with their defaults.

    >>> policy_loss_options("sapo")
    {'tau_pos': 1.0, 'tau_neg': 1.05}
    """
    params = inspect.signature(_get(name)).parameters.values()
    return {p.name: p.default for p in params
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _NEEDS[name]}


def check_policy_loss(name: str, **options: Any) -> None:
    """Raise ``ValueError`` naming every unknown loss, unknown option and out-of-range value (no tensors needed).

    >>> check_policy_loss("vanilla", clip_hihg=0.28)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: policy loss 'vanilla' has no option 'clip_hihg'; its options: [..., 'clip_high', 'clip_low', 'dual_clip']
    """
    accepted = policy_loss_options(name)
    problems = []
    for key, value in options.items():
        if key not in accepted:
            problems.append(f"policy loss {name!r} has no option {key!r}; its options: {sorted(accepted)}")
            continue
        accepts, what = _RULES.get(key, (lambda v: True, ""))
        try:
            ok = accepts(value)
        except TypeError:
            ok = False
        if not ok:
            problems.append(f"policy loss {name!r}: {key}={value!r} must be {what}")
    if problems:
        raise ValueError("; ".join(problems))


def policy_loss(name: str, log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor,
                step_inputs: Optional[dict[str, Tensor]] = None, **options: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """The registered loss ``name`` per position, and its metrics.

    Args:
        name: one of :func:`available_policy_losses`.
        log_prob: ``[B, T]`` under the policy being trained (carries the gradient).
        old_log_prob: ``[B, T]`` under the policy that sampled (no gradient is taken through it).
        advantages: ``[B, T]`` (or ``[B, 1]``, broadcast over positions).
        mask: ``[B, T]`` bool (or 0/1).
        step_inputs: ``{name: [B, T]}``, the :func:`policy_loss_needs` of the loss (others are ignored).
        options: the loss's options (:func:`policy_loss_options`), e.g. ``clip_high`` for DAPO clip-higher.
    Returns:
        loss ``[B, T]`` (0 on masked positions) and metrics ``clip_frac`` (= ``clip_frac_high + clip_frac_low``),
        ``clip_frac_high`` (clipped above ``1 + clip_high``), ``clip_frac_low`` (below ``1 - clip_low``),
        ``dual_clip_frac``, ``approx_kl`` (mean ``(log r)^2 / 2``, as flow_grpo), ``ppo_kl`` (mean ``-log r``, verl's
        ``actor/ppo_kl``), ``ratio_mean``, ``ratio_min``, ``ratio_max``.
    Raises:
        ValueError: an unknown loss or option, a bad option value, shapes that do not match, or a missing step input.

    >>> loss, m = policy_loss("vanilla", torch.tensor([[0.5, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2),
    ...                       torch.tensor([[True, False]]))
    >>> loss.tolist(), m["clip_frac"].item()  # r = e^0.5 > 1.2: the clipped branch -A * 1.2
    ([[-1.2000000476837158, 0.0]], 1.0)
    """
    check_policy_loss(name, **options)
    if log_prob.dim() != 2 or old_log_prob.shape != log_prob.shape or mask.shape != log_prob.shape:
        raise ValueError(f"log_prob, old_log_prob and mask must share one [B, T] shape; got "
                         f"{tuple(log_prob.shape)}, {tuple(old_log_prob.shape)}, {tuple(mask.shape)}")
    if torch.broadcast_shapes(advantages.shape, log_prob.shape) != log_prob.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} do not broadcast to [B, T] = {tuple(log_prob.shape)}")
    mask = mask.bool()
    zero = log_prob.new_zeros(())
    # where(), not a product: padding may hold -inf log-probs, and nan * 0 is nan in value and gradient
    log_prob, old_log_prob = torch.where(mask, log_prob, zero), torch.where(mask, old_log_prob, zero)
    advantages = torch.where(mask, advantages.to(log_prob.dtype).expand_as(log_prob), zero)
    needs, given = _NEEDS[name], step_inputs or {}
    if set(needs) - set(given):
        raise ValueError(f"policy loss {name!r} needs the step inputs {sorted(set(needs) - set(given))} "
                         f"(:func:`policy_loss_needs`); got {sorted(given)}")
    # masked positions hold a safe value (a std of 1, not 0 or nan): where(), so nothing reaches their gradient
    extra = {key: torch.where(mask, given[key].to(log_prob.dtype), STEP_INPUTS[key]) for key in needs}
    loss, metrics = _get(name)(log_prob, old_log_prob, advantages, mask, **extra, **options)
    return torch.where(mask, loss, zero), metrics


# -- metrics ---------------------------------------------------------------------------------------------------
