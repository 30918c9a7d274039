"""The estimator registry: ``register``, ``available``, ``resolve``, ``compute`` and the peer presets.

``register(name)`` turns a core function ``fn(rewards, mask, group_ids, *, <inputs>, <options>)`` into the public
estimator: it checks shapes and finiteness, checks that the optional inputs the function reads were passed,
validates option values, computes in float64, broadcasts a ``[B]`` result over positions, applies ``clip`` and
zeroes masked positions. Keyword-only parameters named after an optional input (``INPUTS``) are inputs (required
unless they default to None); every other keyword-only parameter is an option, and its default is the estimator's
default.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch import Tensor

from flowrl.advantages.primitives import SINGLETONS, STD_SCOPES

Estimator = Callable[..., Tensor]

INPUTS = {
    "values": "values [B, T]: critic values V(s_t) (gae)",
    "baselines": "baselines [B]: the reward of a greedy / ODE sample of each row's prompt (remax)",
    "step_group_ids": "step_group_ids [B, T] int: step group or tree node of each position, scoped within its group",
    "stratum_ids": "stratum_ids [B] int: the stratum of each row (stratified_grpo)",
    "process_rewards": "process_rewards [B, T]: per-step process rewards, e.g. an implicit PRM (prime)",
    "log_probs": "log_probs [B, T]: the sampled log-prob of each position (tree: path-probability node values)",
}
_SHAPES = {"values": 2, "baselines": 1, "step_group_ids": 2, "stratum_ids": 1, "process_rewards": 2,
           "log_probs": 2}


def _choice(*allowed) -> Callable[[Any], bool]:
    return lambda v: v in allowed


def _unit(v) -> bool:
    return isinstance(v, (int, float)) and 0.0 <= v <= 1.0


_VALID: dict[str, tuple[Callable[[Any], bool], str]] = {
    "eps": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "ddof": (_choice(0, 1), "0 (population std) or 1 (unbiased)"),
    "std_scope": (_choice(*STD_SCOPES), f"one of {list(STD_SCOPES)}"),
    "singleton": (_choice(*SINGLETONS), f"one of {list(SINGLETONS)}"),
    "clip": (lambda v: v is None or (isinstance(v, (int, float)) and v > 0), "None or a number > 0"),
    "gamma": (lambda v: v is None or _unit(v), "a number in [0, 1]"),
    "lam": (_unit, "a number in [0, 1]"),
    "among": (_choice("depth", "siblings"), "'depth' or 'siblings'"),
    "value": (_choice("mean", "path_prob"), "'mean' (of the leaves below) or 'path_prob' (BranchGRPO's fusion)"),
    "alpha": (lambda v: isinstance(v, (int, float)), "a number"),
    "weight": (lambda v: isinstance(v, (int, float)), "a number"),
}

_REGISTRY: dict[str, Estimator] = {}

# name@peer -> (estimator, options that reproduce the peer or the method). Sources: docs/estimators-and-losses.md and
# the method pages; a method names its preset as the default of its ``advantage`` option.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo@verl": ("grpo", dict(eps=1e-6, ddof=1, std_scope="group", singleton="raw", clip=None)),
    "grpo@trl": ("grpo", dict(eps=1e-4, ddof=1, std_scope="group", singleton="zero", clip=None)),
    "grpo@flow_grpo": ("grpo", dict(eps=1e-4, ddof=0, std_scope="batch", singleton="zero", clip=5.0)),
    "dr_grpo@verl": ("dr_grpo", dict(singleton="raw")),
    "dr_grpo@trl": ("dr_grpo", dict(singleton="zero")),
    "rloo@verl": ("rloo", dict(singleton="raw")),
    "rloo@trl": ("rloo", dict(singleton="zero")),
    # Flow-GRPO's numerics (population std, +1e-4, clip 5) per (group, step): DenseGRPO Eq. 10, TP-GRPO's and
    # TempFlow-GRPO's per-prompt / per-seed stat trackers
    "step_grpo@flow_grpo": ("step_grpo", dict(eps=1e-4, ddof=0, std_scope="group", clip=5.0)),
    # G2RPO bcmi/Granular-GRPO fastvideo/train_g2rpo_hps.py train_one_step: per (prompt, step) column, unbiased std,
    # +1e-8 (their adv clip 5 applies after summing the columns: flowrl.advantages.granular)
    "step_grpo@g2rpo": ("step_grpo", dict(eps=1e-8, ddof=1, std_scope="group", singleton="zero")),
    # Dynamic-TreeRPO (no public code; flowrl's reading): node values normalised among their depth, Flow-GRPO's numerics
    "tree@tree_rpo": ("tree", dict(among="depth", eps=1e-4, ddof=0, clip=5.0)),
    # BranchGRPO fastvideo/train_branchgrpo_flux.py compute_hierarchical_advantages_by_depth: unbiased std, +1e-8
    "tree@branch_grpo": ("tree", dict(among="depth", value="mean", eps=1e-8, ddof=1)),
}


def option_problems(name: str, fn: Estimator, options: dict[str, Any]) -> list[str]:
    """Every problem with ``options`` for the estimator ``fn`` registered as ``name``, each naming the fix."""
    accepted = fn.options
    problems = []
    for key, value in options.items():
        if key not in accepted:
            problems.append(f"{name} has no option {key!r}; its options are {sorted(accepted)}")
        elif key in _VALID and not _VALID[key][0](value):
            problems.append(f"{name}: {key}={value!r} must be {_VALID[key][1]}")
    return problems


def _check_inputs(name: str, fn: Estimator, rewards: Tensor, mask: Tensor, group_ids: Tensor,
                  inputs: dict[str, Tensor | None]) -> None:
    if rewards.ndim != 2 or mask.shape != rewards.shape:
        raise ValueError(f"rewards and mask must both be [B, T]; got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    if group_ids.shape != rewards.shape[:1] or group_ids.is_floating_point():
        raise ValueError(f"group_ids must be an integer [B]={rewards.shape[0]} tensor; got {group_ids.dtype} "
                         f"{tuple(group_ids.shape)}")
    valid = mask.bool()
    if not torch.isfinite(rewards[valid]).all():
        raise ValueError("rewards contain NaN or inf at valid positions; mask those rows out first")
    for key in fn.inputs:
        x = inputs.get(key)
        if x is None and key in fn.optional_inputs:
            continue
        if x is None:
            raise ValueError(f"advantage estimator {name!r} needs {INPUTS[key]}; pass {key}=... to compute")
        if tuple(x.shape) != tuple(rewards.shape[:_SHAPES[key]]):
            raise ValueError(f"{key} must have shape {tuple(rewards.shape[:_SHAPES[key]])} (as rewards); "
                             f"got {tuple(x.shape)}")
        if key.endswith("_ids") and x.is_floating_point():
            raise ValueError(f"{key} must be an integer tensor; got {x.dtype}")
        finite = x if x.ndim == 1 else x[valid]
        if x.is_floating_point() and not torch.isfinite(finite).all():
            raise ValueError(f"{key} contains NaN or inf at valid positions")


def register(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator adding the estimator ``fn(rewards, mask, group_ids, *, inputs..., options...)`` as ``name``.

    The returned function is the public estimator: it takes ``clip`` besides ``fn``'s options and returns
    ``[B, T]`` advantages, zero where ``mask`` is 0.
    """
    if "@" in name:
        raise ValueError(f"{name!r}: '@' is reserved for presets (name@peer)")

    def wrap(fn: Estimator) -> Estimator:
        if name in _REGISTRY:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        signature = inspect.signature(fn)
        keywords = [p for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
        clip = inspect.Parameter("clip", inspect.Parameter.KEYWORD_ONLY, default=None)

        @functools.wraps(fn)
        def estimator(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, clip: float | None = None,
                      **kwargs) -> Tensor:
            inputs = {k: kwargs.pop(k) for k in list(kwargs) if k in INPUTS}
            _check_inputs(name, estimator, rewards, mask, group_ids, inputs)
            problems = option_problems(name, estimator, {**kwargs, "clip": clip})
            if problems:
                raise ValueError("; ".join(problems))
            mask = mask.bool()
            inputs = {k: inputs[k].double() if inputs[k].is_floating_point() else inputs[k] for k in estimator.inputs
                      if inputs.get(k) is not None}
            adv = fn(rewards.double(), mask, group_ids, **inputs, **kwargs)
            if adv.ndim == 1:
                adv = adv[:, None].expand_as(mask)
            if clip is not None:
                adv = adv.clamp(-clip, clip)
            out_dtype = torch.promote_types(rewards.dtype, torch.float32)
            return torch.where(mask, adv, 0.0).to(out_dtype)  # where, not *: a NaN at padding must not leak

        estimator.inputs = tuple(p.name for p in keywords if p.name in INPUTS)
        # an input with a default (None) is read only by some options, e.g. the tree's path-probability values
        estimator.optional_inputs = tuple(p.name for p in keywords if p.name in INPUTS and p.default is not p.empty)
        estimator.options = {**{p.name: p.default for p in keywords if p.name not in INPUTS}, "clip": None}
        estimator.__signature__ = signature.replace(parameters=[*signature.parameters.values(), clip])
        _REGISTRY[name] = estimator
        return estimator

    return wrap


def available() -> list[str]:
    """Every estimator and preset name ``compute`` accepts."""
    return sorted([*_REGISTRY, *PRESETS])


def resolve(name: str, **options) -> tuple[Estimator, dict[str, Any]]:
    """The estimator for ``name`` and its options: a preset's options, overridden by ``options``.

    Cheap and model-free, so configs are checked with it before any weight loads.

    Raises:
        ValueError: an unknown name, an option the estimator does not take (the message lists the accepted
            ones), or an option value out of its domain; all problems in one message.
    """
    base, preset = PRESETS.get(name, (name, {}))
    if base not in _REGISTRY:
        raise ValueError(f"unknown advantage estimator {name!r}; available: {available()}")
    fn, merged = _REGISTRY[base], {**preset, **options}
    problems = option_problems(name, fn, merged)
    if problems:
        raise ValueError("; ".join(problems))
    return fn, merged


def compute(name: str, rewards: Tensor, mask: Tensor, group_ids: Tensor, **kwargs) -> Tensor:
    """Advantages ``[B, T]`` from the estimator or preset ``name``.

    Args:
        rewards: ``[B, T]`` outcome on the last valid position and/or dense step rewards.
        mask: ``[B, T]`` bool, the positions that carry a loss. group_ids: ``[B]`` int, rows sharing a prompt.
        **kwargs: the optional inputs (``values``, ``baselines``, ``step_group_ids``, ``stratum_ids``,
            ``process_rewards``) and the estimator's options. Inputs the estimator does not read are ignored, so a
            method can pass everything its rollout has; an unknown option is an error.
    Returns:
        ``[B, T]``, zero where ``mask`` is 0.
    """
    inputs = {k: v for k, v in kwargs.items() if k in INPUTS}
    fn, options = resolve(name, **{k: v for k, v in kwargs.items() if k not in INPUTS})
    return fn(rewards, mask, group_ids, **{k: inputs[k] for k in fn.inputs if k in inputs}, **options)
