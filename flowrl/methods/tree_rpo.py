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
  ``-lambda max(A, 0) log p``, beside the policy loss of each of its edges (:mod:`flowrl.methods.layer_tuning`:
  the target and the weight read from the paper's description [reading]).

Cost per tree: ``w + sum_{l<d} B^l + B^d (T - w - d)`` evaluations (asserted), ``sum_{l=1..d} B^l`` trained edges.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from flowrl.methods.layer_tuning import layer_tuning_weights
from flowrl.methods.tree_method import TreeMethod, tree_problems
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.tree import TreeShape

TREE_ADVANTAGE_OPTIONS: dict[str, Any] = {"among": "depth", "eps": 1e-4, "ddof": 0, "clip": 5.0}


def tree_rpo_problems(window_size: int = 4, window_start: int = 0, window_shift_every: Optional[int] = None,
                      branches: int = 2, depth_noise: float = 0.0, layer_tuning: float = 0.0, num_steps: int = 10,
                      **tree: Any) -> list[str]:
    """Problems with Dynamic-TreeRPO's options and the tree layer's (before any weight loads)."""
    problems = tree_problems(num_steps=num_steps, **tree)
    if window_size < 1 or not 0 <= window_start <= num_steps - window_size:
        problems.append(f"model.window_start={window_start}, model.window_size={window_size}: the window must lie "
                        f"in the {num_steps} steps")
    if branches < 2 or depth_noise < 0 or (window_shift_every is not None and window_shift_every < 1):
        problems.append(f"model.branches={branches} must be >= 2, model.depth_noise={depth_noise} >= 0 and "
                        f"model.window_shift_every={window_shift_every} >= 1 (or null)")
    if layer_tuning < 0:
        problems.append(f"model.layer_tuning={layer_tuning} must be >= 0 (0 turns LayerTuning-RL off)")
    return problems


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
        advantage: default ``tree`` (node values from the leaves).
        advantage_options: None means :data:`TREE_ADVANTAGE_OPTIONS` when the estimator is ``tree``.
        loss_options: None means the reward-conditioned clip ``{clip_eta: 1.0, clip_bounds: [clip_range / 2,
            3 clip_range]}``.
    """

    option_problems = staticmethod(tree_rpo_problems)  # the CLI checks a config with it before loading weights

    def __init__(self, policy: FlowPolicy, window_size: int = 4, window_start: int = 0,
                 window_shift_every: Optional[int] = None, branches: int = 2, depth_noise: float = 0.0,
                 layer_tuning: float = 0.0, advantage: str = "tree", advantage_options: Optional[dict[str, Any]] = None,
                 clip_range: float = 1e-4, loss_options: Optional[dict[str, Any]] = None, **kwargs: Any):
        if problems := tree_rpo_problems(window_size=window_size, window_start=window_start,
                                         window_shift_every=window_shift_every, branches=branches,
                                         depth_noise=depth_noise, layer_tuning=layer_tuning, **kwargs):
            raise ValueError("invalid method settings:\n  " + "\n  ".join(problems))
        if advantage_options is None and advantage == "tree":
            advantage_options = dict(TREE_ADVANTAGE_OPTIONS)
        if loss_options is None:
            loss_options = {"clip_eta": 1.0, "clip_bounds": [clip_range / 2, 3 * clip_range]}
        super().__init__(policy, advantage=advantage, advantage_options=advantage_options, clip_range=clip_range,
                         loss_options=loss_options, **kwargs)
        self.window_size, self.window_start, self.window_shift_every = window_size, window_start, window_shift_every
        self.branches, self.depth_noise, self.layer_tuning = branches, depth_noise, layer_tuning

    def window(self) -> int:
        """The window's first step at this batch (a function of the optimizer step, so a resumed run agrees)."""
        if self.window_shift_every is None:
            return self.window_start
        batches = self.global_step // (self.ppo.num_inner_epochs * self.ppo.num_minibatches)
        span = self.num_steps - self.window_size - self.window_start + 1
        return self.window_start + (batches // self.window_shift_every) % span

    def tree_shape(self) -> TreeShape:
        T, d, w = self.num_steps, self.window_size, self.window()
        inside = [w <= k < w + d for k in range(T)]
        scale = [1.0 + self.depth_noise * (k - w) / max(d - 1, 1) if inside[k] else 1.0 for k in range(T)]
        return TreeShape(splits=tuple(self.branches if i else 1 for i in inside), sde=tuple(inside),
                         noise_scale=tuple(scale), side=(0,) * T, stop=w + d)

    def supervised_weights(self, batch: Rollout, total: Tensor, valid: Tensor, advantages: Tensor) -> Optional[Tensor]:
        if not self.layer_tuning:
            return None
        return layer_tuning_weights(batch.node_ids, total, self.advantage_groups(batch), valid, advantages,
                                    self.layer_tuning)
