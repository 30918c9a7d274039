"""Completion and scoring: the ODE completion of chosen states of a rollout under the current policy, decoded and
scored by the reward set's weighted total. DenseGRPO (every state), TP-GRPO (the states entering its SDE window)
and TempFlow-GRPO (its branch points) differ only in which states they complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from flowrl.sampling.completion_rewards import DecodeFn, ScoreFn, completion_rewards
from flowrl.sampling.ode_complete import complete_trajectories
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import VelocityFn
from flowrl.sampling.steps import get_step


@dataclass
class Completions:
    """How completions run. completion_steps: Euler steps each (None: the remaining schedule; 0: no model call at
    all, the one-step estimate ``z_k - sigma_k v(z_k)`` from the velocity the sampler already computed at ``z_k``);
    completion_chunk_size: completions per model call (None: all at once); reward_chunk_size: images per decode +
    score call (None: all at once)."""

    completion_steps: Optional[int] = None
    completion_chunk_size: Optional[int] = None
    reward_chunk_size: Optional[int] = None

    def evaluations(self, starts: list[int], num_steps: int) -> int:
        """Model evaluations of one trajectory's completions from the states ``starts`` (``T - k`` each, at most
        ``completion_steps``; none when they reuse the sampler's velocity).

        >>> Completions().evaluations(list(range(10)), 10), Completions(completion_steps=2).evaluations([0, 9], 10)
        (55, 3)
        """
        if self.completion_steps == 0:
            return 0
        return sum(min(self.completion_steps or num_steps, num_steps - k) for k in starts)

    def problems(self) -> list[str]:
        """What makes the options impossible, each naming the key (the dense methods' option checks call it).

        >>> Completions(completion_steps=-1, reward_chunk_size=0).problems()  # doctest: +NORMALIZE_WHITESPACE
        ['model.completion_steps=-1 must be >= 0 (0: reuse the sampling velocity; null: the remaining schedule)',
         'model.reward_chunk_size=0 must be >= 1 (or null)']
        """
        floors = {"completion_steps": 0, "completion_chunk_size": 1, "reward_chunk_size": 1}
        hints = {"completion_steps": " (0: reuse the sampling velocity; null: the remaining schedule)"}
        return [f"model.{key}={getattr(self, key)} must be >= {low}{hints.get(key, ' (or null)')}"
                for key, low in floors.items() if getattr(self, key) is not None and getattr(self, key) < low]

    @torch.no_grad()
    def score(self, rollout: Rollout, starts: Optional[Tensor], velocity: VelocityFn,
              decode: DecodeFn, total_score: ScoreFn, step_kind: str) -> tuple[Tensor, Tensor]:
        """``R [B, K]``, the weighted total reward of the ODE completion of each row's state ``starts[k]`` (None:
        every state before a step), and the evaluations it took per row ``[B]``.

        Args:
            velocity: ``(z, sigma, rows) -> v`` with ``rows`` indexing the rollout's rows; decode: see
                :data:`~flowrl.sampling.completion_rewards.DecodeFn` (its ``rows`` index the rollout's rows).
            step_kind: the deterministic step (``ode``, or ``ddim_ode`` for epsilon models).
        """
        if self.completion_steps == 0:
            return self.score_reused(rollout, starts, decode, total_score, step_kind)
        completed = complete_trajectories(velocity, rollout.latents, rollout.sigmas[0], starts, self.completion_steps,
                                          self.completion_chunk_size, step_kind=step_kind)
        rewards = completion_rewards(decode, completed.latents, rollout.prompts, total_score, self.reward_chunk_size)
        return rewards, completed.nfe.sum(1)

    def score_reused(self, rollout: Rollout, starts: Tensor, decode: DecodeFn,
                     total_score: ScoreFn, step_kind: str) -> tuple[Tensor, Tensor]:
        """One deterministic step from ``z_k`` straight to sigma 0 with the sampler's own velocity at ``z_k``
        (``rollout.velocities``): no model evaluation."""
        if rollout.velocities is None:
            raise ValueError("completion_steps: 0 reuses the sampler's velocities, but the rollout kept none")
        batch, k = rollout.batch_size, starts.long()
        z, v = rollout.latents[:, k].flatten(0, 1), rollout.velocities[:, k].flatten(0, 1)  # [B * K, ...]
        sigma = rollout.sigmas[:, k].flatten()
        clean = get_step(step_kind)(z, v, sigma, torch.zeros_like(sigma)).z_next.unflatten(0, (batch, len(k)))
        rewards = completion_rewards(decode, clean, rollout.prompts, total_score, self.reward_chunk_size)
        return rewards, torch.zeros(batch, device=rewards.device)
