"""The tree sampler: a batch of trees with every shared prefix computed once (TempFlow-GRPO, Dynamic-TreeRPO,
BranchGRPO).

Per tree (one prompt and seed) a frontier of nodes advances step by step; all frontier nodes of a step go through
the model in one batched call (chunked only by ``chunk_size``). A :class:`TreeShape` says, per step ``k``:

- ``splits[k]``: children per frontier node (1: the node advances alone; ``B > 1``: ``B`` SDE children, each with
  its own noise: a binary split at every window step is Dynamic-TreeRPO, splits at a few steps BranchGRPO);
- ``sde[k]``: whether the frontier's step is the SDE or the ODE, and ``noise_scale[k]`` the multiplier of the SDE's
  noise level there (Dynamic-TreeRPO's growth with depth, BranchGRPO's split scale);
- ``side[k]``: one-step SDE side branches per frontier node that leave the tree at once and are completed with the
  ODE; they reuse the frontier's velocity at ``z_k`` (TempFlow-GRPO's branches off its ODE trajectory);
- ``stop``: the frontier's last step + 1; its nodes are then completed with the ODE to the end (or are final at
  ``stop = T``); ``frontier_leaves`` says whether they are scored rows;
- ``granularities``: each side branch is completed once per granularity ``g`` (a leaf each), on the schedule's next
  point then every ``g``-th (G²RPO's multi-granularity completions; ``(1,)``: once, on every step).

Every leaf (a row) records its path: the node reached by each step (``node_ids [L, T]``, a run of equal ids being
one node), the log-prob of each transition, which were stochastic, and where its states lie in ``node_latents``:
each unique state is stored once (completion states are not kept; the clean result is). Noise: a tree's initial
noise is :func:`~flowrl.sampling.sampler.seeded_noise` of its seed (so a tree's ODE trunk is the plain ODE sample
of that seed), the noise of a node's step ``k`` comes from ``branch_seed(seed, path + (k,))`` and a node's id is
``branch_seed(seed, path)``: the same config gives the same tree bit for bit on any number of processes, and ids
are unique across the batch. NFE: a frontier evaluation is shared by the leaves below it, so a leaf's ``nfe`` is
its share of the frontier's plus its own completion's, and the leaves' sum is the batch's evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from flowrl.sampling.ode_complete import ode_complete
from flowrl.sampling.sampler import (NoiseStream, VelocityFn, apply_step, branch_seed, model_velocity,
                                     seeded_noise)
from flowrl.sampling.steps import ode_kind

_STEP, _SIDE, _GRAIN = 1 << 40, 1 << 41, 1 << 42  # path markers: a step's noise, a side branch, a completion grid


@dataclass(frozen=True)
class TreeShape:
    """What every frontier node does at each of the ``T`` steps (see the module docstring)."""

    splits: tuple[int, ...]
    sde: tuple[bool, ...]
    noise_scale: tuple[float, ...]
    side: tuple[int, ...]
    stop: int
    frontier_leaves: bool = True
    granularities: tuple[int, ...] = (1,)

    def problems(self) -> list[str]:
        """What makes the shape impossible (sizes, a split on an ODE step, nothing to score)."""
        T, out = len(self.splits), []
        if not (len(self.sde) == len(self.noise_scale) == len(self.side) == T) or not 1 <= self.stop <= T:
            out.append("a tree shape needs splits, sde, noise_scale and side of one length T and 1 <= stop <= T")
        elif any(b > 1 and not s for b, s in zip(self.splits, self.sde)) or min(self.splits) < 1:
            out.append("every split step must be an SDE step, with at least 1 child")
        elif not self.frontier_leaves and not any(self.side[:self.stop]):
            out.append("a tree without frontier leaves needs side branches to score")
        if not self.granularities or min(self.granularities) < 1:
            out.append(f"granularities {list(self.granularities)}: give at least one, each >= 1")
        return out

    def leaves(self) -> int:
        """Leaves (rows) per tree."""
        frontier, side = 1, 0
        for k in range(self.stop):
            side += frontier * self.side[k] * len(self.granularities)
            frontier *= self.splits[k]
        return side + (frontier if self.frontier_leaves else 0)

    def evaluations(self, completion_steps: Optional[int] = None) -> int:
        """Model evaluations per tree (a CFG pair counted once): one per frontier node and step, plus each leaf's ODE
        completion, ``min(completion_steps, T - start)`` steps from where it leaves the frontier (a side branch's
        completion at granularity ``g``: ``ceil((T - start) / g)``).

        >>> TreeShape(splits=(1, 2, 2), sde=(False, True, True), noise_scale=(1.0,) * 3, side=(0,) * 3,
        ...           stop=3).evaluations()  # 1 + 1 + 2 frontier nodes, no completion
        4
        >>> TreeShape(splits=(1,) * 4, sde=(False,) * 4, noise_scale=(1.0,) * 4, side=(2, 2, 0, 0), stop=2,
        ...           frontier_leaves=False).evaluations()  # trunk 2 + side branches: 2 x 3 (from 1) + 2 x 2 (from 2)
        12
        >>> TreeShape(splits=(1,) * 4, sde=(False,) * 4, noise_scale=(1.0,) * 4, side=(2, 0, 0, 0), stop=1,
        ...           frontier_leaves=False, granularities=(1, 2)).evaluations()  # 1 + 2 x (3 + 2)
        11
        """
        T = len(self.splits)
        steps = lambda start, g=1: -(-min(completion_steps or T, T - start) // g)  # noqa: E731  (ceil)
        frontier, total = 1, 0
        for k in range(self.stop):
            total += frontier + frontier * self.side[k] * sum(steps(k + 1, g) for g in self.granularities)
            frontier *= self.splits[k]
        return total + (frontier * steps(self.stop) if self.frontier_leaves else 0)


@dataclass
class Trees:
    """Sampled trees, one row per leaf: ``tree [L]`` (the input tree of each leaf), ``node_ids``, ``log_probs``,
    ``sde_mask [L, T]``, ``state_index [L, T+1]`` into ``node_latents [N, ...]`` (-1: not stored), ``final [L, ...]``
    clean latents, ``nfe [L]`` float, ``granularity [L]`` long (of each leaf's completion; 1 for the frontier's),
    and ``evaluations`` (model rows evaluated in all)."""

    tree: Tensor
    node_ids: Tensor
    log_probs: Tensor
    sde_mask: Tensor
    state_index: Tensor
    node_latents: Tensor
    final: Tensor
    nfe: Tensor
    evaluations: int
    granularity: Optional[Tensor] = None


@dataclass
class _Frontier:
    z: Tensor  # [F, ...]
    tree: Tensor  # [F]
    paths: list[tuple[int, ...]]
    node: Tensor  # [F] the node each state is in
    history: dict[str, Tensor]  # [F, T] node / lp / sde / eval, [F, T+1] state

    def pick(self, rows: Tensor) -> "_Frontier":
        return _Frontier(self.z[rows], self.tree[rows], [self.paths[i] for i in rows.tolist()], self.node[rows],
                         {k: v[rows].clone() for k, v in self.history.items()})


def _ids(seeds: Tensor, paths: Sequence[Sequence[int]]) -> Tensor:
    return torch.tensor([branch_seed(s, p) for s, p in zip(seeds.tolist(), paths)], dtype=torch.long)


@torch.no_grad()
def sample_trees(velocity: VelocityFn, seeds: Tensor, latent_shape: Sequence[int], sigmas: Tensor,
                 shape: TreeShape, step_kind: str = "flow_grpo", noise_level: float | Tensor = 0.7,
                 completion_steps: Optional[int] = None, chunk_size: Optional[int] = None,
                 device: torch.device | str = "cpu") -> Trees:
    """Sample one tree per seed (``velocity(z, sigma, rows)``: ``rows`` index the trees, i.e. their prompts).

    Args:
        seeds: ``[P]`` the trees' seeds. sigmas: ``[T + 1]``. shape: :class:`TreeShape` of ``T`` steps.
        noise_level: float or ``[T]``, multiplied by ``shape.noise_scale``.
        completion_steps, chunk_size: of the ODE completions (:func:`~flowrl.sampling.ode_complete.ode_complete`);
            ``chunk_size`` also bounds the rows of one frontier call.
    """
    T, P = sigmas.numel() - 1, seeds.numel()
    levels = torch.as_tensor(noise_level, dtype=torch.float32).expand(T) * torch.tensor(shape.noise_scale)
    store: list[Tensor] = []
    z0 = NoiseStream(seeds, latent_shape, T + 1, device).draw(0)  # as `sample` draws it: the trunk is its ODE sample
    history = {"node": torch.zeros(P, T, dtype=torch.long), "lp": torch.zeros(P, T), "sde": torch.zeros(P, T).bool(),
               "eval": torch.full((P, T), -1, dtype=torch.long),
               "state": torch.full((P, T + 1), -1, dtype=torch.long)}
    history["state"][:, 0] = torch.arange(P)
    store.extend(z0.unbind(0))
    roots = _ids(seeds, [()] * P)
    frontier = _Frontier(z0, torch.arange(P), [()] * P, roots, history)
    pending: list[tuple[_Frontier, int, bool]] = []  # (leaves to complete with the ODE, from which state, side)
    finished: list[_Frontier] = []
    evaluations = 0
    for k in range(shape.stop):
        sigma, sigma_next = sigmas[k].to(device), sigmas[k + 1].to(device)
        n = len(frontier.paths)
        v = model_velocity(velocity, frontier.z, sigma.expand(n), frontier.tree, chunk_size)  # once for the node's
        evaluations += n  # children and side branches alike
        tree_seeds = seeds[frontier.tree]
        for j in range(shape.side[k]):  # one-step SDE branches off z_k, reusing v
            paths = [p + (_SIDE + k * 1024 + j,) for p in frontier.paths]
            child = _advance(frontier, v, k, paths, step_kind, sigma, sigma_next, levels[k], tree_seeds, store, True)
            pending.append((child, k + 1, True))
        children = []
        for c in range(shape.splits[k]):
            paths = [p + (c,) for p in frontier.paths] if shape.splits[k] > 1 else frontier.paths
            children.append(_advance(frontier, v, k, paths, step_kind, sigma, sigma_next, levels[k], tree_seeds,
                                     store, shape.sde[k], new_node=shape.splits[k] > 1))
        frontier = _merge(children) if len(children) > 1 else children[0]
    if shape.frontier_leaves and shape.stop == T:
        finished.append(frontier)
    elif shape.frontier_leaves:
        pending.append((frontier, shape.stop, False))
    leaves = _complete(pending, finished, velocity, sigmas, seeds, completion_steps, chunk_size, step_kind, store,
                       shape.granularities)
    nfe, completion_evals = _nfe_shares(leaves, roots)
    return Trees(tree=leaves.tree, node_ids=leaves.history["node"], log_probs=leaves.history["lp"],
                 sde_mask=leaves.history["sde"], state_index=leaves.history["state"],
                 node_latents=torch.stack(store) if store else z0[:0], final=leaves.z, nfe=nfe,
                 evaluations=evaluations + completion_evals, granularity=leaves.history["granularity"])


def _advance(frontier: _Frontier, v: Tensor, k: int, paths: list[tuple], step_kind: str, sigma: Tensor,
             sigma_next: Tensor, level: Tensor, tree_seeds: Tensor, store: list[Tensor], stochastic: bool,
             new_node: bool = True) -> _Frontier:
    """Every frontier node takes step ``k`` (the SDE if ``stochastic``, else its ODE) from its model output ``v``
    along ``paths`` (a new node per path unless ``new_node`` is False)."""
    n = len(paths)
    noise = seeded_noise(_ids(tree_seeds, [p + (_STEP + k,) for p in paths]), frontier.z.shape[1:], 1,
                         frontier.z.device)[:, 0]
    out = apply_step(frontier.z, v, sigma.expand(n), sigma_next.expand(n), step_kind,
                     torch.full((n,), stochastic), noise, level)
    child = frontier.pick(torch.arange(n))
    child.z, child.paths = out.z_next, list(paths)
    child.node = _ids(tree_seeds, paths) if new_node else frontier.node.clone()
    h = child.history
    h["node"][:, k], h["lp"][:, k], h["sde"][:, k], h["eval"][:, k] = child.node, out.log_prob.cpu(), stochastic, \
        frontier.node
    h["state"][:, k + 1] = torch.arange(len(store), len(store) + n)
    store.extend(out.z_next.unbind(0))
    return child


def _cat(parts: list[_Frontier]) -> _Frontier:
    """The frontiers one after the other."""
    return parts[0] if len(parts) == 1 else _Frontier(
        torch.cat([p.z for p in parts]), torch.cat([p.tree for p in parts]), [x for p in parts for x in p.paths],
        torch.cat([p.node for p in parts]), {k: torch.cat([p.history[k] for p in parts]) for k in parts[0].history})


def _merge(parts: list[_Frontier]) -> _Frontier:
    """The children of every node, node by node (a node's children next to each other)."""
    order = torch.arange(len(parts) * len(parts[0].paths)).view(len(parts), -1).t().reshape(-1)
    return _cat(parts).pick(order)


def _complete(pending: list[tuple[_Frontier, int, bool]], finished: list[_Frontier], velocity: VelocityFn,
              sigmas: Tensor, seeds: Tensor, completion_steps: Optional[int], chunk_size: Optional[int],
              step_kind: str, store: list[Tensor], granularities: tuple[int, ...] = (1,)) -> _Frontier:
    """The leaves, in order (side branches by step, then the frontier), the pending ones completed with the ODE in
    one batched call each; a completed leaf's last node continues over its completion steps, except a side branch
    completed at several granularities: a leaf per granularity (in their order), each completion a node of its own
    below the branch's (they share the branch's step, not their completions')."""
    parts = []
    for leaves, start, side in pending:
        n, granular = len(leaves.paths), side and tuple(granularities) != (1,)
        grains = torch.tensor(granularities if granular else (1,)).repeat_interleave(n)  # [n * copies]
        if granular:
            leaves = _cat([leaves.pick(torch.arange(n)) for _ in granularities])
            n = len(leaves.paths)
            leaves.paths = [p + (_GRAIN + g,) for p, g in zip(leaves.paths, grains.tolist())]
            leaves.node = _ids(seeds[leaves.tree], leaves.paths)
        done = ode_complete(velocity, leaves.z, leaves.tree, torch.full((n,), start), sigmas, completion_steps,
                            chunk_size, ode_kind(step_kind), grains if granular else None)
        leaves.z = done.latents
        leaves.history["node"][:, start:] = leaves.node[:, None]
        leaves.history["completion"] = done.nfe.float()
        leaves.history["granularity"] = grains
        leaves.history["state"][:, -1] = torch.arange(len(store), len(store) + n)
        store.extend(done.latents.unbind(0))
        parts.append(leaves)
    for leaves in finished:
        leaves.history["completion"] = torch.zeros(len(leaves.paths))
        leaves.history["granularity"] = torch.ones(len(leaves.paths), dtype=torch.long)
        parts.append(leaves)
    return _cat(parts)


def _nfe_shares(leaves: _Frontier, roots: Tensor) -> tuple[Tensor, int]:
    """Each leaf's evaluations: its share of every frontier evaluation above it (split evenly among the leaves it
    serves) plus its completion's. Returns ``(nfe [L], completion evaluations)``."""
    evals = leaves.history["eval"]  # [L, T] the node evaluated at step k for this leaf, -1 if none
    nfe = leaves.history["completion"].clone()
    for k in range(evals.shape[1]):
        used = evals[:, k] >= 0
        if used.any():
            _, inverse, counts = torch.unique(evals[used, k], return_inverse=True, return_counts=True)
            nfe[used] += 1.0 / counts[inverse].float()
    return nfe, int(leaves.history["completion"].sum())
