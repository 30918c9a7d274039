"""LayerTuning-RL (Dynamic-TreeRPO's supervised term): pull each depth's step toward the best leaf's path.

The paper describes an SFT loss whose target at each layer is "the prediction of the highest-reward path in the
group", weighted dynamically by a reward gap, with a coefficient lambda; it gives neither the target's form nor the
weight precisely. flowrl reads it as [reading]: the likelihood of each transition on the best leaf's path of a tree,
``- lambda * max(A, 0) * log p_theta(edge)``, added to the policy loss of that edge. ``A`` is the edge's advantage
(its node's value normalised among its depth: the reward gap of the best path at that layer), so only an edge that
beats its depth's mean is pulled, and more the further it does. The gradient moves the policy's step mean at the
parent state toward the best path's next state, i.e. the velocity toward the one that path took. Unlike the clipped
policy loss it is not bounded by the trust region: it is a reward-weighted regression onto the best path.
"""

from __future__ import annotations

import torch
from torch import Tensor


def best_path_mask(node_ids: Tensor, rewards: Tensor, groups: Tensor, valid: Tensor) -> Tensor:
    """``[B, T]``: which transitions lie on the path of their group's best valid leaf (its row's node at each step).

    Node ids are unique across the batch, so a transition is on a best path when its node is one of those paths'.

    >>> node_ids = torch.tensor([[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]])  # one tree: 4 leaves, 2 splits
    >>> best_path_mask(node_ids, torch.tensor([0.1, 0.9, 0.5, 0.2]), torch.zeros(4), torch.ones(4).bool()).int()
    tensor([[1, 1, 0],
            [1, 1, 1],
            [1, 0, 0],
            [1, 0, 0]], dtype=torch.int32)
    """
    score = torch.where(valid, rewards.float(), torch.full_like(rewards, -torch.inf, dtype=torch.float))
    _, group = groups.unique(return_inverse=True)
    best = torch.full((int(group.max()) + 1,), -torch.inf, device=score.device).scatter_reduce(
        0, group, score, "amax")
    best_rows = [int(((group == g) & (score == best[g]) & valid).nonzero()[0]) for g in range(len(best))
                 if torch.isfinite(best[g])]  # the first of a tie
    if not best_rows:
        return torch.zeros_like(node_ids, dtype=torch.bool)
    return torch.isin(node_ids, node_ids[best_rows].flatten())


def layer_tuning_weights(node_ids: Tensor, rewards: Tensor, groups: Tensor, valid: Tensor, advantages: Tensor,
                         coefficient: float) -> Tensor:
    """``[B, T]`` weights of the likelihood term: ``coefficient * max(A, 0)`` on the best paths' transitions.

    >>> node_ids = torch.tensor([[0, 1], [0, 2]])
    >>> adv = torch.tensor([[0.0, 1.0], [0.0, -1.0]])
    >>> layer_tuning_weights(node_ids, torch.tensor([0.9, 0.1]), torch.zeros(2), torch.ones(2).bool(), adv, 0.5)
    tensor([[0.0000, 0.5000],
            [0.0000, 0.0000]])
    """
    on_path = best_path_mask(node_ids, rewards, groups, valid) & valid[:, None]
    return coefficient * advantages.clamp(min=0) * on_path
