"""Policy losses shared by LLM tokens and denoising steps: a registry of pure functions on ``[B, T]`` tensors.

Notation:
    B: rows (a completion, a sampler trajectory); T: positions (tokens, denoising steps).
    log_prob, old_log_prob, advantages ``[B, T]`` float; mask ``[B, T]`` bool (positions that carry a loss).
    r = exp(log_prob - old_log_prob), the per-position importance ratio; sg(x): x with its gradient stopped.

Every loss is ``fn(log_prob, old_log_prob, advantages, mask, **options) -> (loss [B, T], metrics)``: the loss is 0
where ``mask`` is 0 and no gradient reaches a masked position even if it holds ``inf`` or ``nan`` (padding), and
``metrics`` are detached scalars, each a mean (or min / max) over valid positions. A loss that needs more than
log-probs per position (a Gaussian step's mean shift and std: Flow-DPPO, GRPO-Guard) declares those names when it
registers (``needs``, from :data:`STEP_INPUTS`) and takes them as keyword tensors ``[B, T]`` beside its options;
:func:`policy_loss_needs` tells the caller which to hand over. Reduce the loss with
:func:`flowrl.losses.aggregate`. Formulas follow verl ``verl/trainer/ppo/core_algos.py``
(``compute_policy_loss_<name>``); a deviation says so where it happens.

Scale: a diffusion step's log-prob is a Gaussian log-density *averaged* over latent dims (flow_grpo, DanceGRPO),
so clip ranges there are ~1e-4, where 0.2 is usual for tokens.
"""

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
_MAX_LOG_RATIO = 20.0  # as verl: keeps exp finite on stale samples


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


def _mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x.float(), 0.0).sum() / mask.sum().clamp_min(1)


def _metrics(log_ratio: Tensor, ratio: Tensor, mask: Tensor, high: Optional[Tensor] = None,
             low: Optional[Tensor] = None, dual: Optional[Tensor] = None) -> dict[str, Tensor]:
    """Masked diagnostics; ``high``/``low``/``dual`` are ``[B, T]`` bools of the positions each clip is active."""
    with torch.no_grad():
        none = torch.zeros_like(mask)
        high, low, dual = (none if x is None else x for x in (high, low, dual))
        valid = ratio.detach()[mask].float()
        out = {"clip_frac": _mean(high | low, mask), "clip_frac_high": _mean(high, mask),
               "clip_frac_low": _mean(low, mask), "dual_clip_frac": _mean(dual, mask),
               "approx_kl": _mean(0.5 * log_ratio.detach() ** 2, mask), "ppo_kl": _mean(-log_ratio.detach(), mask),
               "ratio_mean": _mean(ratio.detach(), mask)}
        out["ratio_min"] = valid.min() if valid.numel() else torch.tensor(float("nan"))
        out["ratio_max"] = valid.max() if valid.numel() else torch.tensor(float("nan"))
    return out


def _ratio(log_prob: Tensor, old_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    log_ratio = (log_prob - old_log_prob).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return log_ratio, log_ratio.exp()


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float,
                       clip_high: Optional[float]) -> tuple[Tensor, Tensor, Tensor]:
    """``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` and where its clip is active above / below."""
    clip_high = clip_low if clip_high is None else clip_high
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    active = clipped > unclipped  # A > 0 and r > 1 + clip_high, or A < 0 and r < 1 - clip_low
    return torch.maximum(unclipped, clipped), active & (advantages > 0), active & (advantages < 0)


# -- losses ----------------------------------------------------------------------------------------------------


@register_policy_loss("vanilla")
def vanilla(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
            clip_high: Optional[float] = None, dual_clip: Optional[float] = None, clip_eta: Optional[float] = None,
            clip_bounds: Optional[tuple[float, float]] = None,
            clip_bounds_scale: Optional[tuple[float, float]] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip (arXiv 1707.06347): ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, then for ``A < 0`` and
    ``dual_clip = c``: ``min(that, -A c)`` (dual-clip PPO, arXiv 1912.09729). ``clip_high > clip_low`` is DAPO's
    clip-higher (arXiv 2503.14476, 0.28 vs 0.2). verl ``compute_policy_loss_vanilla`` always applies the dual clip
    (``clip_ratio_c = 3.0``); here it is off unless set, as in flow_grpo and TRL. verl reports the dual-clip
    fraction as ``pg_clipfrac_lower``; here that is ``dual_clip_frac``.

    ``clip_eta = eta`` makes the clip reward-conditioned (Dynamic-TreeRPO, arXiv 2509.23352, Eq. 11, as its
    reviews describe it; no public code): each position's range is ``clamp(eps (1 + eta |A|), *clip_bounds)`` with
    ``eps`` its ``clip_low`` / ``clip_high``, so a large advantage may move its ratio further; ``clip_bounds_scale``
    gives the bounds as multiples of each ``eps`` instead (``(0.5, 3)``: ``[eps / 2, 3 eps]``, the same for any clip
    range).

    >>> loss, m = vanilla(torch.tensor([[0.5]]).log1p(), torch.zeros(1, 1), torch.full((1, 1), 2.0),
    ...                   torch.ones(1, 1, dtype=torch.bool), clip_low=0.1, clip_eta=1.0, clip_bounds=(0.0, 0.25))
    >>> round(loss.item(), 4)  # eps = clamp(0.1 * (1 + 2), 0, 0.25) = 0.25: r = 1.5 clipped to 1.25, -2 * 1.25
    -2.5

    >>> loss, m = vanilla(torch.tensor([[1.5e-4]]).log1p(), torch.zeros(1, 1), torch.ones(1, 1),
    ...                   torch.ones(1, 1, dtype=torch.bool), clip_low=1e-4)
    >>> round(loss.item(), 6), m["clip_frac_high"].item()
    (-1.0001, 1.0)
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    if clip_eta is not None:
        factor = 1.0 + clip_eta * advantages.detach().abs()
        bounds = lambda eps: ((eps * clip_bounds_scale[0], eps * clip_bounds_scale[1]) if clip_bounds_scale  # noqa: E731
                              else clip_bounds or (0.0, float("inf")))
        clip_low, clip_high = ((eps * factor).clamp(*bounds(eps))
                               for eps in (clip_low, clip_low if clip_high is None else clip_high))
    loss, high, low = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    dual = None
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
    return loss, _metrics(log_ratio, ratio, mask, high, low, dual)


@register_policy_loss("gspo", sequence_level=True)
def gspo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
         clip_high: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (arXiv 2507.18071): PPO clip on the row's geometric-mean ratio ``s = exp(mean_t log r_t)``, in verl's
    stop-gradient form ``log s_t = log_prob_t - sg(log_prob_t) + sg(log s)`` (clamped at 10): every position's value
    is ``s``, and position t's gradient is ``-A s`` times ``grad log_prob_t``. With ``seq-mean-token-mean``
    aggregation (verl forces it) and one advantage per row this is the paper's gradient
    ``-A s mean_t grad log_prob_t``. The paper's clip ranges are 3e-4 / 4e-4 (verl and TRL use their usual clip).

    >>> loss, m = gspo(torch.tensor([[0.2, 0.4]]), torch.zeros(1, 2), torch.ones(1, 2),
    ...                torch.ones(1, 2, dtype=torch.bool), clip_low=0.5)
    >>> [round(x, 4) for x in loss[0].tolist()]  # s = exp(0.3) = 1.3499 for both positions
    [-1.3499, -1.3499]
    """
    m = mask.to(log_prob.dtype)
    seq_log_ratio = ((log_prob - old_log_prob) * m).sum(-1) / m.sum(-1).clamp_min(1)  # [B]
    log_ratio = (log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]).clamp(max=10.0)  # [B, T]
    ratio = log_ratio.exp()
    loss, high, low = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    metrics = _metrics(log_prob - old_log_prob, ratio, mask, high, low)
    return loss, metrics


@register_policy_loss("gpg")
def gpg(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor,
        mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG (arXiv 2504.02546), plain REINFORCE: ``-A log_prob``, no ratio, no clip (verl ``compute_policy_loss_gpg``).
    Its gradient is the on-policy policy gradient however stale ``old_log_prob`` is; the ratio is reported only.
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    return -advantages * log_prob, _metrics(log_ratio, ratio, mask)


@register_policy_loss("cispo")
def cispo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
          clip_high: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) A log_prob``; the clipped
    ratio is a detached weight, so clipped positions keep their gradient (verl ``compute_policy_loss_cispo``).
    TRL's ``loss_type="cispo"`` caps only from above, ``min(r, epsilon_high)``: that is ``clip_low=1``,
    ``clip_high=epsilon_high - 1`` here.

    >>> loss, m = cispo(torch.tensor([[-1.0]]), torch.tensor([[-2.0]]), torch.ones(1, 1),
    ...                 torch.ones(1, 1, dtype=torch.bool))
    >>> round(loss.item(), 4), m["clip_frac_high"].item()  # r = e > 1.2: -1.2 * 1 * (-1)
    (1.2, 1.0)
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * advantages * log_prob
    return loss, _metrics(log_ratio, ratio, mask, ratio > 1.0 + clip_high, ratio < 1.0 - clip_low)


@register_policy_loss("sapo")
def sapo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, tau_pos: float = 1.0,
         tau_neg: float = 1.05) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (arXiv 2511.20347), a soft trust region: ``-A sigmoid(tau (r - 1)) 4 / tau`` with ``tau = tau_pos`` where
    ``A > 0`` else ``tau_neg`` (verl ``compute_policy_loss_sapo`` defaults; TRL's ``sapo`` is the same gate). At
    ``r = 1`` the gate's slope is 1, so the gradient is the on-policy ``-A grad log_prob``; it fades as ``r`` leaves
    1 instead of being cut. verl forces ``seq-mean-token-mean`` aggregation. No hard clip: clip fractions are 0.

    >>> loss, _ = sapo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool))
    >>> loss.item()  # -1 * sigmoid(0) * 4 / 1
    -2.0
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return -gate * advantages, _metrics(log_ratio, ratio, mask)
