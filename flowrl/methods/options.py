"""Option checks of the method layer: pure functions of the config values, run before any weight loads.

One function per layer (the base, policy gradient, Flow-GRPO's trained-step fraction, the completions of the dense
methods), each calling the one below. The CLI calls a method's ``option_problems`` on the parsed config
(``flowrl.cli.config_problems``) and the method's ``__init__`` calls it again, so a bad value fails with a message
naming the key whichever way the method is built.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from flowrl import advantages as adv_lib
from flowrl import losses
from flowrl.policies.base import FlowPolicy
from flowrl.rewards.aggregate import AGGREGATIONS
from flowrl.sampling.steps import ODE_STEPS, PREDICTIONS, STEPS


def resolved_loss_options(loss: str, clip_range: float, loss_options: Optional[dict] = None) -> dict[str, Any]:
    """The policy loss's options: ``clip_range`` is its ``clip_low`` (where it has one) unless ``loss_options`` says.

    >>> resolved_loss_options("vanilla", 1e-4, {"clip_high": 2e-4})
    {'clip_low': 0.0001, 'clip_high': 0.0002}
    """
    base = {"clip_low": clip_range} if "clip_low" in losses.policy_loss_options(loss) else {}
    return {**base, **(loss_options or {})}


def loss_problems(loss: str = "vanilla", loss_options: Optional[dict] = None, clip_range: float = 1e-4,
                  **_: Any) -> list[str]:
    """Problems with ``model.loss`` and ``model.loss_options`` (checked before any weight loads)."""
    if loss not in losses.available_policy_losses():
        return [f"model.loss={loss!r}: choose a policy loss from {losses.available_policy_losses()}"]
    try:
        losses.check_policy_loss(loss, **resolved_loss_options(loss, clip_range, loss_options))
    except ValueError as err:
        return [f"model.loss_options: {err}"]
    return []


def base_option_problems(num_steps: int = 10, eval_num_steps: Optional[int] = None, max_nonfinite_steps: int = 3,
                         max_grad_norm: Optional[float] = 1.0, optimizer: Any = None, **_: Any) -> list[str]:
    """Problems with the options every method has (:class:`~flowrl.methods.base.BaseModule`)."""
    problems = []
    if num_steps < 1 or (eval_num_steps is not None and eval_num_steps < 1):
        problems.append(f"model.num_steps={num_steps} and model.eval_num_steps={eval_num_steps} must be >= 1")
    if max_nonfinite_steps < 1:
        problems.append(f"model.max_nonfinite_steps={max_nonfinite_steps} must be >= 1")
    if max_grad_norm is not None and not max_grad_norm > 0:
        problems.append(f"model.max_grad_norm={max_grad_norm} must be > 0 (or null: no clipping)")
    return problems + optimizer_problems(optimizer)


def step_kind_problems(step_kind: str, policy: Any) -> list[str]:
    """``step_kind`` must be an SDE step that reads the model output as the policy predicts it (a velocity for flow
    models, a noise prediction for SD1.5); ``policy`` is an adapter or its parsed ``{class_path, init_args}``."""
    sde_kinds = sorted(set(STEPS) - set(ODE_STEPS.values()))
    if step_kind not in sde_kinds:
        return [f"model.step_kind={step_kind!r}: choose an SDE step from {sde_kinds}"]
    if (predicts := policy_prediction(policy)) and PREDICTIONS[step_kind] != predicts:
        fitting = [k for k in sde_kinds if PREDICTIONS[k] == predicts]
        return [f"model.step_kind={step_kind!r} reads the model output as a {PREDICTIONS[step_kind]}, but the policy "
                f"predicts {predicts}; choose a step kind from {fitting}"]
    return []


def policy_gradient_problems(step_kind: str = "flow_grpo", noise_level: float = 0.7,
                             advantage: str = "grpo@flow_grpo", advantage_options: Optional[dict] = None,
                             beta: float = 0.0, num_inner_epochs: int = 1, num_minibatches: int = 1,
                             micro_batch_size: int = 16, reward_aggregation: str = "sum",
                             sample_chunk_size: Optional[int] = None, policy: Any = None, loss: str = "vanilla",
                             loss_options: Optional[dict] = None, clip_range: float = 1e-4,
                             **base: Any) -> list[str]:
    """Problems with the options of :class:`~flowrl.methods.policy_gradient.PolicyGradient` and the base's, each
    naming the key and the fix (checked before any weight loads)."""
    problems = base_option_problems(**base) + step_kind_problems(step_kind, policy)
    if not noise_level > 0:  # also NaN
        problems.append(f"model.noise_level={noise_level} must be > 0: the SDE step's std is proportional to it, and "
                        "0 or less gives NaN log-probs (use the ODE for deterministic sampling; 0.7 is Flow-GRPO's)")
    if not beta >= 0:
        problems.append(f"model.beta={beta} must be >= 0 (the KL penalty's coefficient; 0 disables it)")
    if min(num_inner_epochs, num_minibatches, micro_batch_size) < 1:
        problems.append("model.num_inner_epochs, num_minibatches and micro_batch_size must be >= 1")
    try:
        adv_lib.resolve(advantage, **(advantage_options or {}))
    except ValueError as err:
        problems.append(f"model.advantage: {err}")
    problems += loss_problems(loss=loss, loss_options=loss_options, clip_range=clip_range)
    if reward_aggregation not in AGGREGATIONS:
        problems.append(f"model.reward_aggregation={reward_aggregation!r}: choose one of {sorted(AGGREGATIONS)}")
    if sample_chunk_size is not None and sample_chunk_size < 1:
        problems.append(f"model.sample_chunk_size={sample_chunk_size} must be >= 1 (or null: the whole batch at once)")
    return problems


def fraction_problems(timestep_fraction: float = 0.99, **others: Any) -> list[str]:
    """Flow-GRPO's options (the policy-gradient ones and ``timestep_fraction``)."""
    problems = policy_gradient_problems(**others)
    if not 0 < timestep_fraction <= 1:
        problems.append(f"model.timestep_fraction={timestep_fraction} must be in (0, 1]")
    return problems


def completion_problems(completion_steps: Optional[int] = None, completion_chunk_size: Optional[int] = None,
                        reward_chunk_size: Optional[int] = None) -> list[str]:
    """The ODE completion options of the dense step-reward methods."""
    floors = {"completion_steps": 0, "completion_chunk_size": 1, "reward_chunk_size": 1}  # 0 steps: reuse v
    values = {"completion_steps": completion_steps, "completion_chunk_size": completion_chunk_size,
              "reward_chunk_size": reward_chunk_size}
    return [f"model.{key}={value} must be >= {floors[key]} (or null)" for key, value in values.items()
            if value is not None and value < floors[key]]


def optimizer_problems(optimizer: Any) -> list[str]:
    """Problems with the optimizer's parsed ``init_args`` (a learning rate that is not positive), found before the
    optimizer (or any weight) is built; an already built optimizer factory is not inspected.

    >>> optimizer_problems({"class_path": "torch.optim.AdamW", "init_args": {"lr": -1e-3}})  # doctest: +ELLIPSIS
    ['model.optimizer.init_args.lr=-0.001 must be > 0 ...']
    """
    init_args = optimizer.get("init_args") if isinstance(optimizer, dict) else getattr(optimizer, "init_args", None)
    if hasattr(init_args, "as_dict"):
        init_args = init_args.as_dict()
    lr = (init_args or {}).get("lr") if isinstance(init_args, dict) else None
    if isinstance(lr, (int, float)) and not lr > 0:
        return [f"model.optimizer.init_args.lr={lr} must be > 0 (e.g. 3.0e-4 for LoRA, 1.0e-5 for full fine-tuning)"]
    return []


def policy_prediction(policy: Any) -> Optional[str]:
    """What a policy's network predicts (``FlowPolicy.prediction``), from the adapter or its parsed config.

    >>> policy_prediction({"class_path": "flowrl.policies.TinyFlowPolicy"}), policy_prediction(None)
    ('velocity', None)
    """
    if isinstance(policy, FlowPolicy):
        return policy.prediction
    path = policy.get("class_path") if isinstance(policy, dict) else getattr(policy, "class_path", None)
    if not isinstance(path, str) or "." not in path:
        return None
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    return getattr(cls, "prediction", None)
