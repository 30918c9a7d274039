"""BranchGRPO (arXiv 2509.06040): SDE trajectories that split at a few steps into a tree, with depth-wise credit.

As the authors' ``fastvideo/train_branchgrpo_flux.py``: every node splits into ``B`` children (2) at the split
steps (their script: 0, 3, 6, 9 of 20 steps; 16 leaves), the SDE runs on every step, and a split step's noise is
scaled by ``split_noise_scale`` (4.0). Leaf rewards are fused upward (``value: mean`` of the leaves below, or
``path_prob``: each node the softmax(child edge log-prob)-weighted value of its children, their
``tree_prob_weighted``), and each edge's advantage is its child node's value normalised among the nodes of its depth
in the tree (``among: depth``, unbiased std, +1e-8, as their ``compute_hierarchical_advantages_by_depth``).

Deviations: the authors draw a split child's noise ``split_noise_scale`` times wider but compute its log-prob with
the unscaled std; here the scaled std is the policy's at that step in sampling and training alike, so ratios start
at 1. Their zeroing of a depth whose std is below 1e-6 is approximated by the +1e-8.

Pruning (the forward rollout is never pruned, only backward passes): ``width_pruning: best_per_branch`` trains the
edges of the best leaf below each last split (their mode 1), ``extremes`` those of the ``width_pruning_count`` best
and worst leaves of each tree (their mode 2); ``depth_pruning`` lists steps not trained. ``mix_window = n``
(BranchGRPO-Mix) keeps the SDE on each split step and the ``n - 1`` steps after it, the ODE elsewhere.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least
from flowrl.methods.tree_method import TreeMethod
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.sampler import trained_steps
from flowrl.sampling.tree import TreeShape

WIDTH_PRUNING = ("none", "best_per_branch", "extremes")


def split_steps_of(num_steps: int, split_steps: Optional[list[int]]) -> list[int]:
    """``split_steps``, or 4 evenly spaced from step 0 (the authors' 0, 3, 6, 9 of 20 scaled to ``T``: ``i T // 5``).

    >>> split_steps_of(20, None), split_steps_of(10, None), split_steps_of(10, [6, 0])
    ([0, 4, 8, 12], [0, 2, 4, 6], [0, 6])
    """
    return sorted(split_steps) if split_steps is not None else [i * num_steps // 5 for i in range(4)]


def depth_pruning_problem(pruned: list, num_steps: int) -> Optional[str]:
    """What is wrong with ``depth_pruning`` at ``num_steps`` steps, naming the values the user gave (None: nothing).

    >>> depth_pruning_problem([9], 4)
    'model.depth_pruning=[9]: 9 is past the last step, 3; list distinct steps in [0, 4) whose edges are not trained'
    >>> depth_pruning_problem([-1, 2, 2], 4).split("; ")[:2]
    ['model.depth_pruning=[-1, 2, 2]: -1 is not a step (step numbers, not Python indices: the last step is 3)', \
'2 is listed twice']
    """
    last = num_steps - 1
    wrong = [f"{k!r} is not a step number" for k in pruned if not isinstance(k, int)]
    if past := [k for k in pruned if isinstance(k, int) and k > last]:
        wrong.append(f"{', '.join(map(str, past))} {'is' if len(past) == 1 else 'are'} past the last step, {last}")
    if negative := [k for k in pruned if isinstance(k, int) and k < 0]:
        wrong.append(f"{', '.join(map(str, negative))} {'is not a step' if len(negative) == 1 else 'are not steps'} "
                     f"(step numbers, not Python indices: the last step is {last})")
    if twice := sorted({k for k in pruned if pruned.count(k) > 1}, key=repr):
        wrong.append(f"{', '.join(map(str, twice))} {'is' if len(twice) == 1 else 'are'} listed twice")
    if not wrong:
        return None
    return (f"model.depth_pruning={pruned}: {'; '.join(wrong)}; list distinct steps in [0, {num_steps}) whose edges "
            "are not trained")


class BranchGRPO(TreeMethod):
    """BranchGRPO. Options beyond the tree layer's (:class:`~flowrl.methods.tree_method.TreeMethod`):

    Args:
        split_steps: the steps at which every node splits (None: 4 evenly spaced from step 0, as 0, 3, 6, 9 of 20).
        branches: ``B``, children per split.
        split_noise_scale: the noise level's multiplier on a split step.
        width_pruning: ``none``, ``best_per_branch`` or ``extremes`` (which leaves' edges are trained).
        width_pruning_count: leaves kept at each end with ``extremes``.
        depth_pruning: steps whose edges are not trained.
        mix_window: SDE on each split step and the next ``mix_window - 1`` steps, ODE elsewhere (None: SDE always).
        advantage: ``tree@branch_grpo``: depth-wise normalised node values, unbiased std, +1e-8 (``advantage_options:
            {value: path_prob}`` for their path-probability fusion).
        step_kind: ``dance``, the authors' SDE.
        noise_level: 0.3, the authors' ``eta``.
    """

    def __init__(self, policy: FlowPolicy, split_steps: Optional[list[int]] = None, branches: int = 2,
                 split_noise_scale: float = 4.0, width_pruning: str = "none", width_pruning_count: int = 1,
                 depth_pruning: Optional[list[int]] = None, mix_window: Optional[int] = None,
                 advantage: str = "tree@branch_grpo", step_kind: str = "dance", noise_level: float = 0.3,
                 **kwargs: Any):
        super().__init__(policy, advantage=advantage, step_kind=step_kind, noise_level=noise_level, **kwargs)
        self.split_steps = split_steps
        self.branches, self.split_noise_scale = branches, split_noise_scale
        self.width_pruning, self.width_pruning_count = width_pruning, width_pruning_count
        self.depth_pruning, self.mix_window = depth_pruning, mix_window

    def splitting_steps(self) -> list[int]:
        """The steps that split (:func:`split_steps_of` of the options)."""
        return split_steps_of(self.num_steps, self.split_steps)

    def problems(self) -> list[str]:
        problems, T, splits = super().problems(), self.num_steps, self.splitting_steps()
        if not splits or splits[0] < 0 or splits[-1] >= T or len(set(splits)) != len(splits):
            given = (f"model.split_steps={splits}" if self.split_steps is not None else
                     f"model.split_steps is unset, and its default at num_steps={T} is {splits}")
            example = list(range(min(T, 4)))
            problems.append(f"{given}: set distinct steps in [0, {T}), e.g. {example}")
        if why := depth_pruning_problem(list(self.depth_pruning or []), T):
            problems.append(why)
        problems += at_least(self, 2, ("branches",)) + at_least(self, 0, ("split_noise_scale",), strict=True)
        problems += at_least(self, 1, ("width_pruning_count",)) + at_least(self, 1, ("mix_window",), hint=" (or null)")
        if self.width_pruning not in WIDTH_PRUNING:
            problems.append(f"model.width_pruning={self.width_pruning!r}: choose one of {WIDTH_PRUNING}")
        return problems

    def shape_of(self, batch: int = 0) -> TreeShape:
        T, splits, window = self.num_steps, self.splitting_steps(), self.mix_window
        sde = [True] * T if window is None else [any(s <= k < s + window for s in splits) for k in range(T)]
        return TreeShape(splits=tuple(self.branches if k in splits else 1 for k in range(T)), sde=tuple(sde),
                         side=(0,) * T, stop=T,
                         noise_scale=tuple(self.split_noise_scale if k in splits else 1.0 for k in range(T)))

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        """Every stochastic step but the ``depth_pruning`` ones."""
        mask = trained_steps(sde_mask, 1.0, sigmas, self.step_kind)
        mask[sorted(self.depth_pruning or [])] = False
        return mask

    def loss_weights(self, batch: Batch) -> Tensor:
        """1 on the edges of the leaves width pruning keeps (an edge shared with a kept leaf is kept), 0 elsewhere."""
        weights = torch.ones_like(batch.log_probs)
        if self.width_pruning == "none":
            return weights
        last = max(self.splitting_steps())  # leaves are grouped by the node they split from at the last split
        kept = kept_leaves(self.width_pruning, torch.where(batch.valid, batch.total, -torch.inf), batch.seeds,
                           batch.node_ids[:, last - 1] if last > 0 else batch.seeds, self.width_pruning_count)
        steps = torch.arange(batch.num_steps, device=weights.device).expand_as(batch.node_ids)
        edges = torch.stack([batch.node_ids, steps], -1)  # an edge: (node, step)
        kept_edges = {tuple(e) for e in edges[kept].reshape(-1, 2).tolist()}
        keep = torch.tensor([[tuple(e) in kept_edges for e in row] for row in edges.tolist()], device=weights.device)
        return weights * keep


def kept_leaves(mode: str, reward: Tensor, tree: Tensor, last_split: Tensor, count: int = 1) -> Tensor:
    """``[L]`` bool: the leaves whose edges width pruning keeps. ``best_per_branch``: the best leaf of each node of
    the last split (``last_split [L]``: the node each leaf is in after it); ``extremes``: the ``count`` best and
    worst leaves of each ``tree``.

    >>> r = torch.tensor([0.1, 0.9, 0.5, 0.3]); trees = torch.zeros(4).long()
    >>> kept_leaves("best_per_branch", r, trees, torch.tensor([7, 7, 8, 8])).tolist()
    [False, True, True, False]
    >>> kept_leaves("extremes", r, trees, torch.tensor([7, 7, 8, 8])).tolist()
    [True, True, False, False]
    """
    keep = torch.zeros_like(reward, dtype=torch.bool)
    groups = last_split if mode == "best_per_branch" else tree
    for g in groups.unique():
        rows = (groups == g).nonzero().flatten()
        order = rows[reward[rows].argsort(descending=True)]
        keep[order[:1] if mode == "best_per_branch" else torch.cat([order[:count], order[-count:]])] = True
    return keep
