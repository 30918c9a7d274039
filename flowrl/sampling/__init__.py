"""Sampler steps with Gaussian log-probs, the sampler loop, the Rollout record and ODE completions with their
rewards (pure tensors, no Lightning)."""

from flowrl.sampling.completion_rewards import completion_rewards
from flowrl.sampling.ode_complete import Completion, complete_trajectories, ode_complete
from flowrl.sampling.rollout import Rollout, sample, sde_steps, seeded_noise, trained_steps
from flowrl.sampling.steps import STEPS, StepOutput, gaussian_log_prob, get_step

__all__ = ["Completion", "Rollout", "STEPS", "StepOutput", "complete_trajectories", "completion_rewards",
           "gaussian_log_prob", "get_step", "ode_complete", "sample", "sde_steps", "seeded_noise", "trained_steps"]
