"""TP-GRPO (TurningPoint-GRPO, arXiv 2602.06422): step rewards from ODE completions inside an SDE window, with
turning points that carry the long-term (aggregated) reward.

Rollout: the SDE (CPS by default) on the ``window_size`` steps ``[w, w + n)``, the ODE elsewhere. Every latent
entering a window step is completed with the policy's ODE and scored: ``R_j`` is the reward of the completion of the
latent after ``j`` SDE steps (``R_0`` from the window start of the same trajectory, hence the same initial noise; the
authors' code draws that baseline from a different noise), ``R_n`` the reward of the trajectory's own image. Step
rewards, turning points and balancing are :mod:`flowrl.methods.turning_points`; balancing counts over the sampling
batch gathered from every rank, so a DDP run equals a one-process run. The advantage is the per (prompt group, window
step) normalisation ``step_grpo``; the loss is Flow-GRPO's PPO-clip on each window step.

Cost per trajectory: ``T`` evaluations for the sample plus ``sum_{j<n} (T - w - j)`` for the completions (64 at
``T = 10``, ``n = 9``), and ``n + 1`` reward calls.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.methods.completions import Completions
from flowrl.methods.options import completion_problems, policy_gradient_problems
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.methods.turning_points import FIRST_STEP_RULES, tp_step_rewards
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import sde_steps

#: ``step_grpo`` as the authors' stat tracker: per (prompt, step) population std, +1e-4, advantages clipped to 5.
TP_ADVANTAGE_OPTIONS: dict[str, Any] = {"eps": 1e-4, "ddof": 0, "std_scope": "group", "clip": 5.0}


def tp_option_problems(num_steps: int = 10, window_start: int = 0, window_size: int = 9, step_kind: str = "cps",
                       first_step: str = "consistent", completion_steps: Optional[int] = None,
                       completion_chunk_size: Optional[int] = None, reward_chunk_size: Optional[int] = None,
                       reward_aggregation: str = "sum", **others: Any) -> list[str]:
    """Problems with TP-GRPO's options (and the loop's), each naming the key and the fix; model-free, so the CLI
    runs it before any weight loads."""
    problems = policy_gradient_problems(num_steps=num_steps, step_kind=step_kind,
                                        reward_aggregation=reward_aggregation, **others)
    if window_start < 0 or window_size < 1 or window_start + window_size > num_steps:
        problems.append(f"model.window_start={window_start}, model.window_size={window_size}: the SDE window "
                        f"[start, start + size) must lie in the {num_steps} sampling steps with size >= 1")
    elif step_kind == "cps" and window_size == 1 and window_start == num_steps - 1:
        problems.append("model.window_size=1 on the last step: a CPS step landing on sigma 0 has no log-prob, so "
                        "nothing would train; start the window earlier")
    if first_step not in FIRST_STEP_RULES:
        problems.append(f"model.first_step={first_step!r}: choose one of {list(FIRST_STEP_RULES)}")
    problems += completion_problems(completion_steps, completion_chunk_size, reward_chunk_size)
    if reward_aggregation != "sum":
        problems.append(f"model.reward_aggregation={reward_aggregation!r}: TP-GRPO differences rewards along a "
                        "trajectory, which needs raw rewards; use `sum` (a weighted sum of the reward callbacks)")
    return problems


class TPGRPO(PolicyGradient):
    """TP-GRPO. Options beyond the loop's (:class:`~flowrl.methods.policy_gradient.PolicyGradient`):

    Args:
        window_start: the first step of the SDE window ``[w, w + n)``; the ODE runs elsewhere and the window steps
            are the trained steps.
        window_size: ``n``, the window's steps.
        step_kind: ``cps`` (the authors' setting) or ``flow_grpo`` / ``dance``.
        clip_range: 1e-5 (authors, CPS).
        constraint: the Def. 5.1 condition on turning points ``j >= 1``.
        first_step: turning-point rule of the first window step: ``consistent`` (default), ``plain`` or ``none``.
        balanced: balance positive and negative turning points over the sampling batch (App. D).
        completion_steps: Euler steps of each ODE completion (None: the remaining schedule).
        completion_chunk_size: rows per model call in the completions (None: all at once).
        reward_chunk_size: images per decode + score call of the completions (None: all at once).
        advantage: default ``step_grpo``.
        advantage_options: None means :data:`TP_ADVANTAGE_OPTIONS` when the estimator is ``step_grpo``.
    """

    option_problems = staticmethod(tp_option_problems)  # the CLI checks a config with it before loading weights

    def __init__(self, policy: FlowPolicy, num_steps: int = 10, window_start: int = 0, window_size: int = 9,
                 step_kind: str = "cps", clip_range: float = 1e-5, advantage: str = "step_grpo",
                 advantage_options: Optional[dict[str, Any]] = None, constraint: bool = True,
                 first_step: str = "consistent", balanced: bool = True, completion_steps: Optional[int] = None,
                 completion_chunk_size: Optional[int] = None, reward_chunk_size: Optional[int] = None,
                 **kwargs: Any):
        if advantage_options is None and advantage == "step_grpo":
            advantage_options = dict(TP_ADVANTAGE_OPTIONS)
        problems = tp_option_problems(num_steps=num_steps, window_start=window_start, window_size=window_size,
                                      step_kind=step_kind, first_step=first_step, completion_steps=completion_steps,
                                      completion_chunk_size=completion_chunk_size,
                                      reward_chunk_size=reward_chunk_size, advantage=advantage,
                                      advantage_options=advantage_options, **kwargs)
        if problems:
            raise ValueError("invalid method settings:\n  " + "\n  ".join(problems))
        super().__init__(policy, num_steps=num_steps, step_kind=step_kind, clip_range=clip_range, advantage=advantage,
                         advantage_options=advantage_options, **kwargs)
        self.window = (window_start, window_start + window_size)
        self.constraint, self.first_step, self.balanced = constraint, first_step, balanced
        self.completions = Completions(completion_steps, completion_chunk_size, reward_chunk_size)

    # -- hooks ---------------------------------------------------------------------------------------------

    def sde_mask(self) -> Tensor:
        """The SDE on the window steps, the ODE elsewhere."""
        return sde_steps(self.num_steps, self.step_kind, self.window)

    def completion_starts(self) -> Tensor:
        """The states entering the window steps: ``completion_rewards [B, n]`` holds ``R_0 .. R_{n-1}``."""
        return torch.arange(*self.window)

    def step_rewards(self, batch: Rollout, total: Tensor, valid: Tensor) -> Tensor:
        """TP-GRPO step rewards on the window steps ``[B, T]``, turning points balanced over the gathered batch."""
        rewards = torch.cat([batch.completion_rewards.to(total), total[:, None]], dim=1)  # [B, n+1] R_0 .. R_n
        step, tp = tp_step_rewards(rewards, self.constraint, self.first_step, self.balanced, valid)
        raw = tp_step_rewards(rewards, self.constraint, self.first_step, False, valid)[1]
        size = valid.sum().clamp(min=1) * tp.shape[1]
        self.log("train/turning_points", tp.sum() / size, batch_size=len(total))
        self.log("train/turning_points_unbalanced", raw.sum() / size, batch_size=len(total))
        out = torch.zeros_like(batch.log_probs)
        out[:, slice(*self.window)] = step.to(out).nan_to_num(0.0)  # invalid rows: masked by the loop
        return out
