"""Methods: one LightningModule per algorithm, each a few hooks on one loop.

The layers, from the bottom, each the parent of the next (only ``BaseModule``'s subclasses are methods):

    LightningModule -> Validation -> Trajectories -> BaseModule
    BaseModule -> PolicyGradient -> FlowGRPO (DDPO: FlowGRPO with the ddim step) -> DenseGRPO
                                 -> TPGRPO
                                 -> TreeMethod -> TempFlowGRPO (-> G2RPO), TreeRPO, BranchGRPO
               -> TDMR1 (its own update on named adapters)
               -> ForwardProcess -> DiffusionNFT, AWM (the forward-process update on named adapters)

What the module owns rather than inherits (the evaluator owns the first two as well):

- ``self.generation``, a :class:`~flowrl.methods.generation.Generation`: conditioning, the guided velocity (every
  model call, counted in ``forward_passes``), deterministic samples from seeds.
- ``self.ranks``, a :class:`~flowrl.methods.distributed.Ranks`: gathers of per-rank rows and the other collectives;
  ``self.training_steps()`` hands the update components the strategy's side of an update as plain callables
  (:class:`~flowrl.training.steps.TrainingSteps`: backward, gradient sync, the checked optimizer step, collectives).
- :class:`~flowrl.methods.step_metrics.StepMetrics`: the metrics every method logs, under the same names.

- :class:`~flowrl.methods.validation.Validation`: validation, evaluation and prediction reduced over ranks (the
  Lightning hooks).
- :class:`~flowrl.methods.trajectories.Trajectories`: the sampling hooks (trajectories from seeded noise through the
  one step loop, ``sde_mask``, ``trained_steps``, ``completion_starts``).
- :class:`~flowrl.methods.base.BaseModule`: the one training loop, for every method: rollout (sampled and scored in
  chunks) -> the batch gathered from every rank (:class:`~flowrl.methods.batch.Batch`) -> aggregated rewards ->
  hooks on it (step rewards, advantages, loss weights, supervised weights; computed once, the same on every rank)
  -> the method's ``update`` -> the same core metrics for every method. The options every method has are declared
  here; every option is an attribute, each class's ``problems()`` states its rules, and they are checked together
  when the most derived ``__init__`` returns, before any weight loads (:mod:`~flowrl.methods.option_surface`).
- :class:`~flowrl.methods.policy_gradient.PolicyGradient`: SDE rollouts, credit on the stochastic steps, and the
  PPO update (:class:`~flowrl.training.ppo_update.PPOUpdate`: minibatches drawn over every rank, micro-batches with
  one gradient sync each, clipping through the strategy, ratio check, log-prob recomputation, KL).
- Algorithms, hooks only: :class:`FlowGRPO` (trained-step fraction), :class:`DenseGRPO` (ODE completions of every
  state, calibrated noise) and :class:`TPGRPO` (an SDE window, turning points), the last two sharing the
  :class:`~flowrl.sampling.completions.Completions` component; the tree methods :class:`TempFlowGRPO` (and
  :class:`G2RPO` on it: a shared anchor, completions at several granularities), :class:`TreeRPO` and
  :class:`BranchGRPO` on :class:`TreeMethod` (one tree per batch row, rows are leaves, every
  edge trained once); :class:`TDMR1` and :class:`DiffusionNFT`, which override only ``update`` (named adapters).

Data flow of one training step (``BaseModule.training_step``):

    batch --encode--> cond --rollout (sample_from / sample_trees, per-row cond_rows)--> Rollout (this rank's rows)
      --reward set (submit per sampling chunk)--> rewards {name: [B]}
      --gather over ranks--> Batch: rewards, groups, masks, node ids, completion rewards   [B_all, ...]
      --aggregate, step_rewards, advantages, loss_weights, supervised_weights (hooks)--> credit [B_all, T]
      --update: this rank's rows--> metrics --log--> train/*, rollout/*
"""

from flowrl.methods.awm import AWM
from flowrl.methods.base import BaseModule
from flowrl.methods.branch_grpo import BranchGRPO
from flowrl.methods.dense_grpo import DenseGRPO
from flowrl.methods.diffusion_nft import DiffusionNFT
from flowrl.methods.flow_grpo import FlowGRPO
from flowrl.methods.forward_process import ForwardProcess
from flowrl.methods.g2rpo import G2RPO
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.methods.tdm_r1 import TDMR1
from flowrl.methods.tempflow_grpo import TempFlowGRPO
from flowrl.methods.tp_grpo import TPGRPO
from flowrl.methods.tree_method import TreeMethod
from flowrl.methods.tree_rpo import TreeRPO

__all__ = ["AWM", "BaseModule", "BranchGRPO", "DenseGRPO", "DiffusionNFT", "FlowGRPO", "ForwardProcess", "G2RPO",
           "PolicyGradient", "TDMR1", "TPGRPO",
           "TempFlowGRPO", "TreeMethod", "TreeRPO"]
