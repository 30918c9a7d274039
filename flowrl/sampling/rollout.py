"""The Rollout: the one record every method fills, linear trajectories and branched or tree rollouts alike.

Shape contract (``B`` rows, ``T`` steps; a row is one trajectory from noise to sample, i.e. one root-to-leaf path of
a tree):

- ``latents [B, T+1, ...]`` the states, noise at index 0 (tree methods keep each unique state once instead:
  ``node_latents [N, ...]`` and ``state_index [B, T+1]`` into it, -1 for states inside ODE completions;
  :meth:`Rollout.states` and :meth:`Rollout.final` read either); ``log_probs [B, T]`` of each transition (0 on ODE steps);
  ``sigmas [B, T+1]``; ``train_mask [B, T]`` the transitions the loss trains.
- ``cond_rows [B]`` the row of the batch's encoded prompts that conditions each rollout row, so rows may outnumber
  prompts and come in any order (default: row ``i`` by prompt ``i``); ``prompts``, ``group_ids``, ``seeds`` ``[B]`` per row.
- ``node_ids [B, T]`` (branch and tree methods): the tree node each transition reaches; rows that share a node
  share that transition bit for bit (and every state before it). A run of equal ids on a row is one node (several
  steps); ids are unique within a group (one tree per prompt, or several trees in one group). Parents and depths
  follow from them (:attr:`Rollout.parent_ids`, :attr:`Rollout.depths`); ``None`` means every row is its own path.
- ``nfe [B]`` the model evaluations spent on each row (a CFG pair counts as one), completions included.
- ``velocities [B, T, ...]``: the model output at each state, kept only where a method reuses it (one-step
  completion estimates that cost no evaluation).
- ``granularity [B]`` (tree methods): the granularity of each leaf's ODE completion (G²RPO completes a branch on
  several grids, a leaf each; 1: every step of the schedule).
- ``images``, ``rewards {name: [B]}``, ``completion_rewards [B, K]`` (ODE completions' weighted totals, dense
  methods), ``step_rewards [B, T]`` (set by the loop from the method's hook).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional, Sequence

import torch
from torch import Tensor


@dataclass
class Rollout:
    """A batch of trajectories (see the module docstring for every field's shape)."""

    prompts: list[str]
    group_ids: Tensor
    seeds: Tensor
    latents: Optional[Tensor]  # None in the view gathered from every rank (hooks see no latents)
    log_probs: Tensor
    sigmas: Tensor
    train_mask: Tensor
    cond_rows: Optional[Tensor] = None
    images: Optional[Tensor] = None
    rewards: dict[str, Tensor] = field(default_factory=dict)
    step_rewards: Optional[Tensor] = None
    completion_rewards: Optional[Tensor] = None
    node_ids: Optional[Tensor] = None
    nfe: Optional[Tensor] = None
    node_latents: Optional[Tensor] = None
    state_index: Optional[Tensor] = None
    velocities: Optional[Tensor] = None
    granularity: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if self.cond_rows is None:  # row i is conditioned by the batch's prompt i
            self.cond_rows = torch.arange(self.log_probs.shape[0], device=self.log_probs.device)

    def states(self, rows: Tensor, steps: Tensor) -> Tensor:
        """The states ``[P, ...]`` of ``rows`` at ``steps``, from the dense ``latents`` or, for trees, from the
        unique ``node_latents`` through ``state_index``."""
        if self.latents is not None:
            return self.latents[rows, steps]
        index = self.state_index[rows, steps]
        if (index < 0).any():
            raise ValueError("a state that the tree sampler did not keep (inside an ODE completion) was asked for")
        return self.node_latents[index.to(self.node_latents.device)]

    def final(self) -> Tensor:
        """The clean latent of every row ``[B, ...]``."""
        if self.latents is not None:
            return self.latents[:, -1]
        return self.states(torch.arange(self.batch_size), torch.full((self.batch_size,), self.num_steps))

    @property
    def num_steps(self) -> int:
        return self.log_probs.shape[1]

    @property
    def batch_size(self) -> int:
        return self.log_probs.shape[0]

    @property
    def parent_ids(self) -> Optional[Tensor]:
        """``[B, T]`` the node before each step's node on its row (-1 at the root); None without ``node_ids``.

        >>> r = Rollout([], torch.zeros(2), torch.zeros(2), None, torch.zeros(2, 3), torch.zeros(2, 4),
        ...             torch.ones(2, 3, dtype=torch.bool), node_ids=torch.tensor([[0, 0, 1], [0, 0, 2]]))
        >>> r.parent_ids.tolist(), r.depths.tolist()
        ([[-1, -1, 0], [-1, -1, 0]], [[0, 0, 1], [0, 0, 1]])
        """
        if self.node_ids is None:
            return None
        ids = self.node_ids
        new = torch.ones_like(ids, dtype=torch.bool)
        new[:, 1:] = ids[:, 1:] != ids[:, :-1]  # a step that enters a new node
        previous = torch.full_like(ids, -1)
        previous[:, 1:] = ids[:, :-1]
        entered = torch.where(new, previous, torch.full_like(ids, -2))  # the parent where a node starts
        return _carry(entered, new)

    @property
    def depths(self) -> Optional[Tensor]:
        """``[B, T]`` how many nodes come before each step's node on its row (0 for the root's)."""
        if self.node_ids is None:
            return None
        new = torch.ones_like(self.node_ids, dtype=torch.bool)
        new[:, 1:] = self.node_ids[:, 1:] != self.node_ids[:, :-1]
        return new.long().cumsum(1) - 1

    def trained_once(self) -> Tensor:
        """``train_mask`` with each shared transition (a node's steps reached by several rows of one group) kept on
        its first row only, so an edge below several leaves is trained once. Without ``node_ids``, ``train_mask``.

        >>> r = Rollout([], torch.zeros(2).long(), torch.zeros(2), None, torch.zeros(2, 2), torch.zeros(2, 3),
        ...             torch.ones(2, 2, dtype=torch.bool), node_ids=torch.tensor([[0, 1], [0, 2]]))
        >>> r.trained_once().tolist()
        [[True, True], [False, True]]
        """
        if self.node_ids is None:
            return self.train_mask
        rows = torch.arange(self.batch_size, device=self.node_ids.device)[:, None].expand_as(self.node_ids)
        steps = torch.arange(self.num_steps, device=self.node_ids.device).expand_as(self.node_ids)
        keys = torch.stack([self.group_ids[:, None].expand_as(self.node_ids).long(), self.node_ids, steps], -1)
        _, inverse = torch.unique(keys.reshape(-1, 3), dim=0, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), self.batch_size, device=rows.device).scatter_reduce(
            0, inverse, rows.reshape(-1), "amin")
        return self.train_mask & (first[inverse].view_as(rows) == rows)

    @classmethod
    def cat(cls, parts: Sequence["Rollout"]) -> "Rollout":
        """The rollouts of consecutive chunks of a batch as one (rows concatenated in order)."""
        def join(values):
            if values[0] is None or isinstance(values[0], int):
                return values[0]
            if isinstance(values[0], dict):
                return {key: torch.cat([v[key] for v in values]) for key in values[0]}
            return torch.cat(values) if torch.is_tensor(values[0]) else [x for v in values for x in v]

        joined = cls(**{f.name: join([getattr(p, f.name) for p in parts]) for f in fields(cls)})
        if parts[0].state_index is not None:  # each part indexes its own node_latents: offset them
            offsets = torch.tensor([0, *[len(p.node_latents) for p in parts[:-1]]]).cumsum(0)
            joined.state_index = torch.cat([torch.where(p.state_index >= 0, p.state_index + int(o), -1)
                                            for p, o in zip(parts, offsets)])
        return joined


def _carry(entered: Tensor, new: Tensor) -> Tensor:
    """Forward-fill ``entered`` (the parent where a node starts) over the steps that stay in the node."""
    index = torch.arange(entered.shape[1], device=entered.device).expand_as(entered)
    last_start = torch.where(new, index, torch.zeros_like(index)).cummax(1).values
    return entered.gather(1, last_start)
