"""Completion and scoring: the ODE completion of chosen states of a rollout under the current policy, decoded and
scored by the reward set's weighted total. DenseGRPO (every state), TP-GRPO (the states entering its SDE window)
and TempFlow-GRPO (its branch points) differ only in which states they complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from flowrl.sampling.completion_rewards import ScoreFn, completion_rewards
from flowrl.sampling.ode_complete import RowVelocityFn, complete_trajectories
from flowrl.sampling.rollout import Rollout


@dataclass
class Completions:
    """How completions run. completion_steps: Euler steps each (None: the remaining schedule);
    completion_chunk_size: completions per model call (None: all at once); reward_chunk_size: images per decode +
    score call (None: all at once)."""

    completion_steps: Optional[int] = None
    completion_chunk_size: Optional[int] = None
    reward_chunk_size: Optional[int] = None

    @torch.no_grad()
    def score(self, rollout: Rollout, starts: Optional[Tensor], velocity: RowVelocityFn,
              decode: Callable[[Tensor], Tensor], total_score: ScoreFn, step_kind: str) -> tuple[Tensor, Tensor]:
        """``R [B, K]``, the weighted total reward of the ODE completion of each row's state ``starts[k]`` (None:
        every state before a step), and the evaluations it took per row ``[B]``.

        Args:
            velocity: ``(z, sigma, rows) -> v`` with ``rows`` indexing the rollout's rows.
            step_kind: the deterministic step (``ode``, or ``ddim_ode`` for epsilon models).
        """
        completed = complete_trajectories(velocity, rollout.latents, rollout.sigmas[0], starts, self.completion_steps,
                                          self.completion_chunk_size, step_kind=step_kind)
        rewards = completion_rewards(decode, completed.latents, rollout.prompts, total_score, self.reward_chunk_size)
        return rewards, completed.nfe.sum(1)
