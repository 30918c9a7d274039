"""Advantage estimators shared by LLM token sequences and denoising trajectories.

Notation (as in torchtune's ``rlhf`` module):
    B: rows (a completion of an LLM, a trajectory of a sampler); T: positions (tokens, denoising steps).
    rewards ``[B, T]``: outcome reward on the last valid position and/or dense step rewards.
    mask ``[B, T]`` bool: positions that carry a loss. group_ids ``[B]`` int: rows sharing a prompt.
    Optional inputs: ``values [B, T]``, ``baselines [B]``, ``step_group_ids [B, T]``, ``stratum_ids [B]``,
    ``process_rewards [B, T]``.

Every estimator is a plain function ``fn(rewards, mask, group_ids, *, inputs..., options...) -> [B, T]``, zero
where ``mask`` is 0, and is registered by name; ``compute(name, ...)`` runs one by name or preset. Numeric
conventions are explicit options, never hidden constants: ``eps``, ``ddof``, ``std_scope`` (``group`` / ``batch``
/ ``global`` / ``none``, defined in ``primitives``), ``singleton`` (``raw`` / ``zero``), ``clip``. Presets
(``name@peer``) pin the options that reproduce a peer exactly:

- ``grpo@verl``: verl ``core_algos.compute_grpo_outcome_advantage``: unbiased group std, ``+1e-6``; a group of one
  keeps its raw score (mean 0 and std 1).
- ``grpo@trl``: TRL ``GRPOTrainer`` with ``scale_rewards="group"``: unbiased group std, ``+1e-4``; a group of one
  gets 0.
- ``grpo@flow_grpo``: yifan123/flow_grpo ``stat_tracking.PerPromptStatTracker`` with ``global_std=True``: group
  mean, population std of the whole gathered batch, ``+1e-4``, clipped to ``[-5, 5]``; a group of one gets 0.
- ``dr_grpo@verl`` / ``dr_grpo@trl`` and ``rloo@verl`` / ``rloo@trl``: a group of one keeps its raw score (verl)
  or gets 0 (TRL ``scale_rewards="none"``, TRL ``RLOOTrainer``, verl ``rloo_vectorized``).

>>> import torch
>>> r = torch.tensor([[0.0, 1.0], [0.0, 3.0]]); m = torch.ones(2, 2, dtype=torch.bool)
>>> compute("grpo@trl", r, m, torch.tensor([0, 0]))  # scores 1 and 3: (-1, 1) / (sqrt(2) + 1e-4)
tensor([[-0.7071, -0.7071],
        [ 0.7071,  0.7071]])
"""

from flowrl.advantages.downsampling import max_variance_subset
from flowrl.advantages.granular import granular_evaluations, granular_grpo, granular_leaf_advantages
from flowrl.advantages.outcome import dr_grpo, gpg, grpo, grpo_passk, opo, rloo
from flowrl.advantages.primitives import (discounted_returns, generalized_advantages, group_stats, masked_whiten,
                                          normalize, scores)
from flowrl.advantages.registry import PRESETS, available, compute, register, resolve
from flowrl.advantages.returns import gae, reinforce_plus_plus, reinforce_plus_plus_baseline, remax
from flowrl.advantages.step import gigpo, prime, step_grpo, stratified_grpo
from flowrl.advantages.trees import tree, tree_nodes

__all__ = [
    "PRESETS", "available", "compute", "register", "resolve",
    "dr_grpo", "gae", "gigpo", "gpg", "granular_evaluations", "granular_grpo", "granular_leaf_advantages", "grpo",
    "grpo_passk", "opo", "prime",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline", "remax", "rloo", "step_grpo", "stratified_grpo", "tree",
    "discounted_returns", "generalized_advantages", "group_stats", "masked_whiten", "max_variance_subset", "normalize",
    "scores",
    "tree_nodes",
]
