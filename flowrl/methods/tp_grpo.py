"""TP-GRPO (TurningPoint-GRPO, arXiv 2602.06422): step rewards from ODE completions inside an SDE window, with
turning points that carry the long-term (aggregated) reward.

Rollout: the SDE (CPS by default) on the ``window_size`` steps ``[w, w + n)``, the ODE elsewhere. Every latent
entering a window step is completed with the policy's ODE and scored: ``R_j`` is the reward of the completion of the
latent after ``j`` SDE steps (``R_0`` from the window start of the same trajectory, hence the same initial noise; the
authors' code draws that baseline from a different noise), ``R_n`` the reward of the trajectory's own image. Step
rewards, turning points and balancing are :mod:`flowrl.advantages.turning_points`; balancing counts over the sampling
batch gathered from every rank, so a DDP run equals a one-process run. The advantage is the per (prompt group, window
step) normalisation ``step_grpo``; the loss is Flow-GRPO's PPO-clip on each window step.

Cost per trajectory: ``T`` evaluations for the sample plus ``sum_{j<n} (T - w - j)`` for the completions (64 at
``T = 10``, ``n = 9``), and ``n + 1`` reward calls.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.advantages.turning_points import FIRST_STEP_RULES, turning_point_credit
from flowrl.methods.batch import Batch
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.completions import Completions
from flowrl.sampling.sampler import sde_steps


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
        completion_steps: Euler steps of each ODE completion (None: the remaining schedule; 0: no model call, the
            one-step estimate from the velocity the sampler already computed).
        completion_chunk_size: rows per model call in the completions (None: all at once).
        reward_chunk_size: images per decode + score call of the completions (None: all at once).
        advantage: ``step_grpo@flow_grpo``, as the authors' stat tracker: per (prompt, step) population std,
            +1e-4, advantages clipped to 5.
    """

    step_credit = "a reward per step at its turning points (one advantage per (row, step))"
    raw_rewards = True  # step rewards difference raw weighted rewards along a trajectory

    def __init__(self, policy: FlowPolicy, window_start: int = 0, window_size: int = 9, step_kind: str = "cps",
                 clip_range: float = 1e-5, advantage: str = "step_grpo@flow_grpo", constraint: bool = True,
                 first_step: str = "consistent", balanced: bool = True, completion_steps: Optional[int] = None,
                 completion_chunk_size: Optional[int] = None, reward_chunk_size: Optional[int] = None,
                 **kwargs: Any):
        super().__init__(policy, step_kind=step_kind, clip_range=clip_range, advantage=advantage, **kwargs)
        self.window_start, self.window_size = window_start, window_size
        self.constraint, self.first_step, self.balanced = constraint, first_step, balanced
        self.completion_steps, self.completion_chunk_size = completion_steps, completion_chunk_size
        self.reward_chunk_size = reward_chunk_size
        self.completions = Completions(completion_steps, completion_chunk_size, reward_chunk_size)

    def window_steps(self) -> tuple[int, int]:
        """The SDE window ``[w, w + n)``."""
        return self.window_start, self.window_start + self.window_size

    def rollout_cost(self) -> tuple[int, int]:
        """``T`` sampling evaluations and the completions of the states entering the window (64 at ``T = 10``)."""
        starts = list(range(*self.window_steps()))
        return 1, self.num_steps + Completions(self.completion_steps).evaluations(starts, self.num_steps)

    def problems(self) -> list[str]:
        problems = super().problems() + self.completions.problems()
        T, w, n = self.num_steps, self.window_start, self.window_size
        if w < 0 or n < 1 or w + n > T:
            start = min(max(w, 0), T - 1)  # the nearest window that fits, start kept if it can be
            size = min(max(n, 1), T - start)
            problems.append(f"model.window_start={w}, model.window_size={n}: the SDE window [start, start + size) "
                            f"must lie in the {T} sampling steps with size >= 1; the nearest that does: "
                            f"--model.init_args.window_start={start} --model.init_args.window_size={size}")
        if self.first_step not in FIRST_STEP_RULES:
            problems.append(f"model.first_step={self.first_step!r}: choose one of {list(FIRST_STEP_RULES)}")
        return problems

    # -- hooks ---------------------------------------------------------------------------------------------

    def sde_mask(self) -> Tensor:
        """The SDE on the window steps, the ODE elsewhere."""
        return sde_steps(self.num_steps, self.step_kind, self.window_steps())

    def completion_starts(self) -> Tensor:
        """The states entering the window steps: ``completion_rewards [B, n]`` holds ``R_0 .. R_{n-1}``."""
        return torch.arange(*self.window_steps())

    def step_rewards(self, batch: Batch):
        """TP-GRPO step rewards on the window steps ``[B, T]``, turning points balanced over the gathered batch; the
        shares of window steps that are turning points, after and before balancing, as diagnostics."""
        total, valid = batch.total, batch.valid
        rewards = torch.cat([batch.completion_rewards.to(total), total[:, None]], dim=1)  # [B, n+1] R_0 .. R_n
        step, tp, unbalanced = turning_point_credit(rewards, self.constraint, self.first_step, self.balanced, valid)
        size = valid.sum().clamp(min=1) * tp.shape[1]
        out = torch.zeros_like(batch.log_probs)
        out[:, slice(*self.window_steps())] = step.to(out).nan_to_num(0.0)  # invalid rows: masked by the loop
        return out, {"turning_points": tp.sum() / size, "turning_points_unbalanced": unbalanced.sum() / size}
