"""Policy gradient on tree rollouts: the layer TempFlow-GRPO, Dynamic-TreeRPO and BranchGRPO share.

A method declares its :class:`~flowrl.sampling.tree.TreeShape` (``tree_shape``); the rollout samples one tree per
batch row with :func:`~flowrl.sampling.tree.sample_trees` (every shared prefix computed once, each unique state
stored once) and records one row per leaf: the tree's prompt, group and seed, its node ids, its transitions'
log-probs and which were stochastic. The loop scores the leaves, the hooks see the gathered leaves, and every edge
is trained once however many leaves sit below it (``Rollout.trained_once``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.methods.trained_pairs import placeholder_sigmas
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.steps import MAX_NOISE_LEVEL
from flowrl.sampling.tree import TreeShape, sample_trees


class TreeMethod(PolicyGradient):
    """Options beyond the loop's (:class:`~flowrl.methods.policy_gradient.PolicyGradient`):

    Args:
        completion_steps: Euler steps of each leaf's ODE completion (None: the remaining schedule).
        tree_chunk_size: at most this many nodes or completions per model call (memory); None: a whole depth.
        advantage_group: normalise advantages among the leaves of one ``tree`` (one seed) or of the ``prompt``'s
            group (all its trees).
    """

    min_group_size = 1  # a tree's leaves form groups of their own (advantage_group: tree)
    step_credit = "advantages per tree node (leaves share their branches' transitions)"

    def __init__(self, policy: FlowPolicy, completion_steps: Optional[int] = None,
                 tree_chunk_size: Optional[int] = None, advantage_group: str = "tree", **kwargs: Any):
        super().__init__(policy, **kwargs)
        self.completion_steps, self.tree_chunk_size = completion_steps, tree_chunk_size
        self.advantage_group = advantage_group

    def problems(self) -> list[str]:
        problems = super().problems() + at_least(self, 1, ("completion_steps", "tree_chunk_size"), hint=" (or null)")
        if self.advantage_group not in ("tree", "prompt"):
            problems.append(f"model.advantage_group={self.advantage_group!r}: choose 'tree' or 'prompt'")
        return problems + self._branch_noise_problems()

    def _branch_noise_problems(self) -> list[str]:
        """A tree scales the SDE's noise level at its branching steps; a step kind with a largest level (DDIM's eta)
        must stay within it there too."""
        bound = MAX_NOISE_LEVEL.get(self.step_kind)
        if bound is None:
            return []
        try:
            peak = self.noise_level * max(self.shape_of().noise_scale)
        except (NotImplementedError, ValueError, TypeError, IndexError):  # no shape, or options its check refuses
            return []
        if peak <= bound or self.noise_level > bound:  # the level itself: PolicyGradient's check says it
            return []
        return [f"model.noise_level={self.noise_level} times the tree's noise scale at its branching steps reaches "
                f"{peak:g}, past {bound:g}, the largest the {self.step_kind} step is defined for; lower noise_level "
                "(or the method's branch noise scale)"]

    def shape_of(self, batch: int = 0) -> TreeShape:
        """What each step does to every frontier node at the ``batch``-th batch (the one hook a tree method must
        declare)."""
        raise NotImplementedError

    def trained_step_mask(self) -> Tensor:
        """The steps with a stochastic transition in the tree of the first batch (an SDE step or a side branch
        before the frontier stops) that the step filter ``trained_steps`` keeps."""
        shape, T = self.shape_of(), self.num_steps
        stochastic = torch.tensor([k < shape.stop and (shape.sde[k] or shape.side[k] > 0) for k in range(T)])
        return stochastic & self.trained_steps(torch.ones(T, dtype=torch.bool), placeholder_sigmas(T))

    def tree_shape(self) -> TreeShape:
        """This batch's tree shape."""
        return self.shape_of(self.batches_done())

    def rollout_cost(self) -> tuple[int, int]:
        """A tree's leaves and its model evaluations (at the first batch)."""
        shape = self.shape_of()
        return shape.leaves(), shape.evaluations(self.completion_steps)

    def noise_levels(self) -> Tensor:
        """The SDE's noise level of each step, times the tree's noise scale there (what sampling and training use)."""
        return super().noise_levels() * torch.tensor(self.tree_shape().noise_scale)

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        """One tree per batch row; one rollout row per leaf (rows outnumber prompts)."""
        sigmas = self.policy.sigmas(self.num_steps).to(self.device)
        seeds = batch["seeds"]
        cond_rows = batch.get("cond_rows", torch.arange(len(seeds), device=self.device))
        shape = self.tree_shape()
        velocity = self.generation.velocity_fn(cond, cond_rows)
        trees = sample_trees(velocity, seeds, self.policy.latent_shape(), sigmas, shape,
                             self.step_kind, super().noise_levels(), self.completion_steps, self.tree_chunk_size,
                             self.device)
        leaf = trees.tree.to(seeds.device)
        steps = self.trained_steps(torch.ones(self.num_steps, dtype=torch.bool), sigmas.cpu())  # [T]
        return Rollout(prompts=[batch["prompts"][i] for i in leaf.tolist()], group_ids=batch["group_ids"][leaf],
                       seeds=seeds[leaf], latents=None, log_probs=trees.log_probs.to(self.device),
                       sigmas=sigmas.expand(len(leaf), -1), cond_rows=cond_rows[leaf.to(cond_rows.device)],
                       train_mask=(trees.sde_mask & steps).to(self.device), node_ids=trees.node_ids.to(self.device),
                       nfe=trees.nfe.to(self.device), node_latents=trees.node_latents,
                       state_index=trees.state_index, granularity=trees.granularity.to(self.device))

    def advantage_groups(self, batch: Batch) -> Tensor:
        """The rows an advantage is normalised among: ``tree`` (the seed: one tree) or ``prompt`` (its group)."""
        return batch.seeds if self.advantage_group == "tree" else batch.group_ids
