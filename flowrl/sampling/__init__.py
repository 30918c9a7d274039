"""Sampler steps with Gaussian log-probs, the sampler loop and the Rollout record (pure tensors, no Lightning)."""

from flowrl.sampling.rollout import Rollout, sample, sde_steps, seeded_noise, trained_steps
from flowrl.sampling.steps import STEPS, StepOutput, gaussian_log_prob, get_step

__all__ = ["Rollout", "STEPS", "StepOutput", "gaussian_log_prob", "get_step", "sample", "sde_steps",
           "seeded_noise", "trained_steps"]
