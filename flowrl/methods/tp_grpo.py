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

from flowrl.methods.grpo_loop import GRPOLoop
from flowrl.methods.options import option_problems
from flowrl.methods.turning_points import FIRST_STEP_RULES, tp_step_rewards
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.rewards.aggregate import weighted_sum
from flowrl.rewards.base import reward_callbacks
from flowrl.sampling.completion_rewards import completion_rewards
from flowrl.sampling.ode_complete import complete_trajectories
from flowrl.sampling.rollout import Rollout, sample, sde_steps, trained_steps
from flowrl.sampling.steps import ode_kind

#: ``step_grpo`` as the authors' stat tracker: per (prompt, step) population std, +1e-4, advantages clipped to 5.
TP_ADVANTAGE_OPTIONS: dict[str, Any] = {"eps": 1e-4, "ddof": 0, "std_scope": "group", "clip": 5.0}


def tp_option_problems(num_steps: int = 10, window_start: int = 0, window_size: int = 9, step_kind: str = "cps",
                       first_step: str = "consistent", completion_steps: Optional[int] = None,
                       completion_chunk_size: Optional[int] = None, reward_chunk_size: Optional[int] = None,
                       reward_aggregation: str = "sum", **others: Any) -> list[str]:
    """Problems with TP-GRPO's options (and the loop's), each naming the key and the fix; model-free, so the CLI
    runs it before any weight loads."""
    problems = option_problems(num_steps=num_steps, step_kind=step_kind, reward_aggregation=reward_aggregation,
                               **others)
    if window_start < 0 or window_size < 1 or window_start + window_size > num_steps:
        problems.append(f"model.window_start={window_start}, model.window_size={window_size}: the SDE window "
                        f"[start, start + size) must lie in the {num_steps} sampling steps with size >= 1")
    elif step_kind == "cps" and window_size == 1 and window_start == num_steps - 1:
        problems.append("model.window_size=1 on the last step: a CPS step landing on sigma 0 has no log-prob, so "
                        "nothing would train; start the window earlier")
    if first_step not in FIRST_STEP_RULES:
        problems.append(f"model.first_step={first_step!r}: choose one of {list(FIRST_STEP_RULES)}")
    for key, value in (("completion_steps", completion_steps), ("completion_chunk_size", completion_chunk_size),
                       ("reward_chunk_size", reward_chunk_size)):
        if value is not None and value < 1:
            problems.append(f"model.{key}={value} must be >= 1 (or null)")
    if reward_aggregation != "sum":
        problems.append(f"model.reward_aggregation={reward_aggregation!r}: TP-GRPO differences rewards along a "
                        "trajectory, which needs raw rewards; use `sum` (a weighted sum of the reward callbacks)")
    return problems


class TPGRPO(GRPOLoop):
    """TP-GRPO. Options beyond the shared loop's (see :class:`~flowrl.methods.grpo_loop.GRPOLoop`):

    Args:
        window_start, window_size: the SDE window ``[w, w + n)`` of sampling steps; the ODE runs elsewhere and the
            window steps are the trained steps (``timestep_fraction`` is not used).
        step_kind: ``cps`` (the authors' setting) or ``flow_grpo`` / ``dance``. clip_range: 1e-5 (authors, CPS).
        constraint: the Def. 5.1 condition on turning points ``j >= 1``. first_step: turning-point rule of the
            first window step: ``consistent`` (default), ``plain`` or ``none``.
        balanced: balance positive and negative turning points over the sampling batch (App. D).
        completion_steps: Euler steps of each ODE completion (None: the remaining schedule).
        completion_chunk_size: rows per model call in the completions. reward_chunk_size: images per decode + score
            call of the completions (None: all at once).
        advantage, advantage_options: default ``step_grpo`` with :data:`TP_ADVANTAGE_OPTIONS` (used when
            ``advantage_options`` is None and the estimator is ``step_grpo``).
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
        self.completion_steps = completion_steps
        self.completion_chunk_size, self.reward_chunk_size = completion_chunk_size, reward_chunk_size

    # -- hooks ---------------------------------------------------------------------------------------------

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        """SDE in the window, ODE elsewhere, then the scored ODE completions of the latents entering the window
        steps: ``completion_rewards [B, n]`` holds ``R_0 .. R_{n-1}``. ``nfe`` adds the completions' evaluations."""
        start, end = self.window
        sigmas = self.policy.sigmas(self.num_steps).to(self.device)
        mask = sde_steps(self.num_steps, self.step_kind, self.window)
        velocity = lambda z, s: self.policy.velocity(z, s, cond, self.guidance_scale)  # noqa: E731
        latents, log_probs = sample(velocity, batch["seeds"], sigmas, self.policy.latent_shape(), self.step_kind,
                                    self.noise_levels(), mask, self.device)
        by_row = lambda z, s, rows: self.policy.velocity(z, s, cond.select(rows), self.guidance_scale)  # noqa: E731
        completed = complete_trajectories(by_row, latents, sigmas, torch.arange(start, end),
                                          self.completion_steps, self.completion_chunk_size,
                                          step_kind=ode_kind(self.step_kind))  # DDIM models complete with DDIM
        size = latents.shape[0]
        train = trained_steps(mask, 1.0, sigmas.cpu(), self.step_kind).to(self.device)
        return Rollout(prompts=batch["prompts"], group_ids=batch["group_ids"], seeds=batch["seeds"],
                       latents=latents, log_probs=log_probs, sigmas=sigmas.expand(size, -1),
                       train_mask=train.expand(size, -1).clone(),
                       completion_rewards=completion_rewards(self.policy.decode, completed.latents, batch["prompts"],
                                                             self.total_score, self.reward_chunk_size),
                       nfe=self.num_steps + round(completed.nfe.sum(1).float().mean().item()))

    def window_rewards(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """This rank's ``R [B, n+1]`` (completions, then the final image's weighted reward) and validity ``[B]``."""
        weights = {r.name: r.weight for r in reward_callbacks(self.trainer.callbacks)}
        final, ok = weighted_sum(rollout.rewards, weights)
        rewards = torch.cat([rollout.completion_rewards.to(final), final[:, None]], dim=1)
        return rewards, ok & torch.isfinite(rewards).all(dim=1)

    def aggregate_rewards(self, rollout: Rollout, weights: dict[str, float]) -> tuple[Tensor, Tensor]:
        """As the loop's, and a sample with a non-finite completion reward is invalid too."""
        total, valid = super().aggregate_rewards(rollout, weights)
        return total, valid & self.window_rewards(rollout)[1]

    def step_rewards(self, rollout: Rollout, total: Tensor) -> Tensor:
        """TP-GRPO step rewards on the window steps ``[B, T]``, turning points balanced over the gathered batch."""
        rewards, valid = self.window_rewards(rollout)
        all_rewards, all_valid = self._gather(rewards), self._gather(valid)
        step, tp = tp_step_rewards(all_rewards, self.constraint, self.first_step, self.balanced, all_valid)
        raw = tp_step_rewards(all_rewards, self.constraint, self.first_step, False, all_valid)[1]
        size = all_valid.sum().clamp(min=1) * tp.shape[1]
        self.log("train/turning_points", tp.sum() / size, batch_size=len(total))
        self.log("train/turning_points_unbalanced", raw.sum() / size, batch_size=len(total))
        if self.trainer.world_size > 1:
            rank, local = self.trainer.global_rank, rewards.shape[0]
            step = step[rank * local:(rank + 1) * local]
        start, end = self.window
        rollout.step_rewards = torch.zeros_like(rollout.log_probs)
        rollout.step_rewards[:, start:end] = step.to(rollout.step_rewards).nan_to_num(0.0)  # invalid rows: masked
        return rollout.step_rewards
