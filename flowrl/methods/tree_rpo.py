"""Dynamic-TreeRPO (arXiv 2509.23352): a binary tree in a sliding SDE window, node values from the leaves.

There is no public code, and the paper's full text was not retrievable: this is an approximate reproduction from
its abstract and reviews, every choice named here and in the docs ([reading] marks a choice where they are silent):

- Window: the SDE on ``[w, w + d)`` (d = 4), the ODE outside; the ODE prefix ``z_0 -> z_w`` is computed once per
  tree. With ``window_shift_every = n`` the window start advances by one step every ``n`` batches and wraps to
  ``window_start`` past ``T - d`` (MixGRPO's progressive window [reading]).
- Tree: in the window every node splits into ``B`` children (B = 2: ``B^d = 16`` leaves), the noise level of depth
  ``l`` scaled by ``1 + depth_noise * l / (d - 1)`` (linear in normalised depth, Eq. 6 as the reviews describe it;
  multiplying Flow-GRPO's ``a`` [reading]); leaves are completed with the ODE and scored.
- Advantage: ``tree``: a node's value is the mean reward of its leaves, each edge's advantage its child node's value
  normalised among the nodes of its depth in the tree (``among: siblings`` compares children of one parent),
  population std, +1e-4, clip 5 [reading: Flow-GRPO's numerics].
- Reward-conditioned clip (Eq. 11): ``eps(A) = clamp(eps_0 (1 + eta |A|), eps_low, eps_high)``, the ``clip_eta`` and
  ``clip_bounds`` options of the ``vanilla`` loss, on by default here (eta 1, bounds [eps_0 / 2, 3 eps_0]
  [reading]).
- LayerTuning-RL (``layer_tuning`` = lambda > 0, off by default): the likelihood of the best leaf's path,
  ``-lambda max(A, 0) log p``, beside the policy loss of each of its edges (:mod:`flowrl.losses.layer_tuning`:
  the target and the weight read from the paper's description [reading]).

Cost per tree: ``w + sum_{l<d} B^l + B^d (T - w - d)`` evaluations (asserted), ``sum_{l=1..d} B^l`` trained edges.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from flowrl.losses.layer_tuning import layer_tuning_weights
from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least
from flowrl.methods.tree_method import TreeMethod
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.tree import TreeShape
from flowrl.sampling.windows import progressive_start


class TreeRPO(TreeMethod):
    """Dynamic-TreeRPO. Options beyond the tree layer's (:class:`~flowrl.methods.tree_method.TreeMethod`):

    Args:
        window_size: ``d``, the SDE window's steps (the tree's depth).
        window_start: ``w``, the first window step (at the first batch).
        window_shift_every: advance the window one step every this many batches, wrapping (None: fixed).
        branches: ``B``, children of every node at every window step.
        depth_noise: ``beta``: the noise level at depth ``l`` is scaled by ``1 + beta * l / (d - 1)``.
        layer_tuning: LayerTuning-RL's ``lambda``: the best leaf's path edges also get ``-lambda max(A, 0) log p``
            (0: off).
        advantage: ``tree@tree_rpo``: node values from the leaves, normalised among the nodes of their depth
            (population std, +1e-4, clip 5).
        loss: ``vanilla@tree_rpo``: the reward-conditioned clip ``eps(A) = clamp(eps (1 + |A|), eps / 2, 3 eps)``.
    """

    def __init__(self, policy: FlowPolicy, window_size: int = 4, window_start: int = 0,
                 window_shift_every: Optional[int] = None, branches: int = 2, depth_noise: float = 0.0,
                 layer_tuning: float = 0.0, advantage: str = "tree@tree_rpo", loss: str = "vanilla@tree_rpo",
                 **kwargs: Any):
        super().__init__(policy, advantage=advantage, loss=loss, **kwargs)
        self.window_size, self.window_start, self.window_shift_every = window_size, window_start, window_shift_every
        self.branches, self.depth_noise, self.layer_tuning = branches, depth_noise, layer_tuning

    def problems(self) -> list[str]:
        problems = super().problems()
        T, d, w = self.num_steps, self.window_size, self.window_start
        if d < 1 or not 0 <= w <= T - d:
            problems.append(f"model.window_start={w}, model.window_size={d}: the window must lie in the {T} steps")
        problems += at_least(self, 2, ("branches",)) + at_least(self, 0, ("depth_noise",))
        problems += at_least(self, 1, ("window_shift_every",), hint=" (or null: a fixed window)")
        return problems + at_least(self, 0, ("layer_tuning",), hint=" (0 turns LayerTuning-RL off)")

    def window_at(self, batch: int) -> int:
        """The window's first step at the ``batch``-th batch (a function of the batch count, so a resumed run
        agrees): ``window_start``, advanced one step every ``window_shift_every`` batches and wrapping."""
        if self.window_shift_every is None:
            return self.window_start
        return progressive_start(batch, start=self.window_start, every=self.window_shift_every,
                                 last=self.num_steps - self.window_size)

    def window(self) -> int:
        """The window's first step at this batch."""
        return self.window_at(self.batches_done())

    def shape_of(self, batch: int = 0) -> TreeShape:
        T, d, w = self.num_steps, self.window_size, self.window_at(batch)
        inside = [w <= k < w + d for k in range(T)]
        scale = [1.0 + self.depth_noise * (k - w) / max(d - 1, 1) if inside[k] else 1.0 for k in range(T)]
        return TreeShape(splits=tuple(self.branches if i else 1 for i in inside), sde=tuple(inside),
                         noise_scale=tuple(scale), side=(0,) * T, stop=w + d)

    def supervised_weights(self, batch: Batch) -> Optional[Tensor]:
        if not self.layer_tuning:
            return None
        return layer_tuning_weights(batch.node_ids, batch.total, self.advantage_groups(batch), batch.valid,
                                    batch.advantages, self.layer_tuning)
