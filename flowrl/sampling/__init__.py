"""Sampling, as pure tensors and a velocity function (no Lightning):

- :mod:`~flowrl.sampling.steps`: one pure function per step kind, ``(z, v, sigma, sigma_next, noise) -> (z_next,
  mean, std, log_prob)``, the log-prob averaged over latent dimensions;
- :mod:`~flowrl.sampling.sampler`: ``sample_from``, the one sampler primitive (continue from any state at any step,
  SDE or ODE per row and step, the caller's noise), ``sample`` from seeded noise, branch noise from
  ``(tree seed, path)``, step masks;
- :mod:`~flowrl.sampling.solver`: ``solver_sample``, deterministic sampling with a model folder's own multistep
  scheduler (Wan's UniPC), for ``generate`` where the pipeline does not step Euler;
- :mod:`~flowrl.sampling.rollout`: the ``Rollout`` record every method fills (rows, conditioning rows, tree node
  ids, per-row NFE) and its tree helpers (parents, depths, edges trained once);
- :mod:`~flowrl.sampling.tree`: the tree sampler (TempFlow-GRPO, Dynamic-TreeRPO, BranchGRPO): a frontier of nodes
  advanced a step at a time, each shared prefix computed once, leaves as rows with their node ids;
- :mod:`~flowrl.sampling.ode_complete` and :mod:`~flowrl.sampling.completion_rewards`: batched ODE completions of
  intermediate states and their rewards (dense step-reward methods);
- :mod:`~flowrl.sampling.completions`: the completion-and-scoring component DenseGRPO, TP-GRPO and TempFlow-GRPO
  share (which states to complete is theirs; the ODE completion, decoding and the reward set's total are here);
- :mod:`~flowrl.sampling.noise_calibration`: DenseGRPO's exploration-space calibration;
- :mod:`~flowrl.sampling.coarse_tail`: MixGRPO-Flash's coarser ODE grid after the SDE window (``coarse_grid``, what
  ``sample(grid=...)`` runs on) and the trajectory put back on the full grid (``expand_to_grid``).
"""

from flowrl.sampling.completion_rewards import completion_rewards
from flowrl.sampling.ode_complete import Completion, complete_trajectories, ode_complete
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import (NoiseStream, branch_seed, path_noise, sample, sample_from, sde_steps,
                                     seeded_noise, trained_steps)
from flowrl.sampling.solver import solver_sample
from flowrl.sampling.steps import STEPS, StepOutput, gaussian_log_prob, get_step

__all__ = ["Completion", "NoiseStream", "Rollout", "STEPS", "StepOutput", "branch_seed", "complete_trajectories",
           "completion_rewards", "gaussian_log_prob", "get_step", "ode_complete", "path_noise", "sample",
           "sample_from", "sde_steps", "seeded_noise", "solver_sample", "trained_steps"]
