"""Methods: one LightningModule per algorithm, each a few hooks on a shared layer.

The layers, from the bottom:

- :class:`~flowrl.methods.base.BaseModule`: the policy, the reward set (every reward callback on the trainer, their
  weights, scoring and totals), generation and evaluation (reduced over ranks), gathers of per-rank rows of any
  size, and the checked optimizer step (a NaN or inf loss or gradient skips it on every rank). Likelihood-free
  methods (TDM-R1, DiffusionNFT) subclass it and write their own ``training_step``.
- :class:`~flowrl.methods.policy_gradient.PolicyGradient`: rollout -> rewards -> hooks on the batch gathered from
  every rank (step rewards, advantages, loss weights; computed once, scattered once) -> the
  :class:`~flowrl.methods.ppo_update.PPOUpdate` component (minibatches drawn over every rank, micro-batches with
  one gradient sync each, clipping through the strategy, ratio check, log-prob recomputation, KL).
- Algorithms: :class:`FlowGRPO` (trained-step fraction), :class:`DenseGRPO` (ODE completions of every state,
  calibrated noise) and :class:`TPGRPO` (an SDE window, turning points), the last two sharing the
  :class:`~flowrl.methods.completions.Completions` component. Branch and tree methods override ``rollout`` to
  fill ``node_ids`` (:mod:`flowrl.sampling.rollout`); edges shared by several leaves are trained once.

Data flow of one training step (``PolicyGradient.training_step``)::

    prompts --policy.encode--> cond --rollout (sample_from, per-row cond_rows)--> Rollout (this rank's rows)
      --reward set (submit per sampling chunk)--> rewards {name: [B]}
      --gather over ranks--> view: rewards, groups, masks, node ids, completion rewards   [B_all, ...]
      --aggregate, step_rewards, advantages, loss_weights, supervised_weights (hooks, same on every rank)--> [B_all, T]
      --this rank's rows--> PPOUpdate: minibatches of the gathered pairs, this rank's share, optimizer steps
"""

from flowrl.methods.base import BaseModule
from flowrl.methods.branch_grpo import BranchGRPO
from flowrl.methods.dense_grpo import DenseGRPO
from flowrl.methods.diffusion_nft import DiffusionNFT
from flowrl.methods.flow_grpo import FlowGRPO
from flowrl.methods.fsdp2_strategy import FSDP2Strategy
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.methods.tdm_r1 import TDMR1
from flowrl.methods.tempflow_grpo import TempFlowGRPO
from flowrl.methods.tp_grpo import TPGRPO
from flowrl.methods.tree_method import TreeMethod
from flowrl.methods.tree_rpo import TreeRPO

__all__ = ["BaseModule", "BranchGRPO", "DenseGRPO", "DiffusionNFT", "FSDP2Strategy", "FlowGRPO", "PolicyGradient",
           "TDMR1", "TPGRPO", "TempFlowGRPO", "TreeMethod", "TreeRPO"]
