"""Tree advantages for branched rollouts (TreeRPO arXiv 2506.05183, SPO arXiv 2505.23564, BranchGRPO,
Dynamic-TreeRPO): each row is one root-to-leaf path, ``step_group_ids[i, t]`` names the tree node row i is at on
step t (scoped within the row's group), and a node's value is the mean outcome of the leaves below it.

Notation: a node is a maximal run of equal ids in a row (a segment); its parent is the row's previous node (the
group's root for the first); its depth is the number of nodes before it on the path.
``V(n) = mean_{i through n} s_i``; the advantage of every position at node n is ``V(n)`` normalised among
``siblings`` (nodes with the same parent: TreeRPO, SPO with ``std_scope="none"`` gives ``V(child) - V(parent)``)
or among all nodes of the group at the same ``depth`` (BranchGRPO's depth-wise normalisation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.advantages.primitives import at_positions, group_index, group_stats, normalize, scores
from flowrl.advantages.registry import register


def tree_nodes(mask: Tensor, group_ids: Tensor, step_group_ids: Tensor) -> dict[str, Tensor]:
    """The tree behind ``step_group_ids``: per valid position its node, per node its parent, depth and group.

    Args:
        mask: ``[B, T]`` bool. group_ids: ``[B]``. step_group_ids: ``[B, T]`` int node ids, ``>= 0`` where valid.
    Returns:
        ``rows``, ``steps``, ``node`` ``[N]`` (N valid positions, row-major) and ``parent`` (-1: the root),
        ``depth``, ``group`` ``[K]`` (K nodes).
    Raises:
        ValueError: a valid position without a node id, or ids that do not form a tree (a node reached from two
        different parents, e.g. the same id reused on two branches).

    >>> ids = torch.tensor([[0, 1], [0, 2]])  # a shared first step, then two leaves
    >>> t = tree_nodes(torch.ones(2, 2, dtype=torch.bool), torch.zeros(2).long(), ids)
    >>> t["node"].tolist(), t["parent"].tolist(), t["depth"].tolist()
    ([0, 1, 0, 2], [-1, 0, 0], [0, 1, 1])
    """
    rows, steps = mask.nonzero(as_tuple=True)
    ids = step_group_ids[rows, steps]
    if (ids < 0).any():
        raise ValueError("tree needs a node id >= 0 in step_group_ids at every valid position")
    node, k = group_index(torch.stack([group_ids[rows], ids], dim=1))
    new_row = torch.ones_like(rows, dtype=torch.bool)
    new_row[1:] = rows[1:] != rows[:-1]
    starts = new_row.clone()
    starts[1:] |= node[1:] != node[:-1]
    seg_node, seg_new_row = node[starts], new_row[starts]  # one entry per segment (a node on a row's path)
    seg_parent = torch.where(seg_new_row, -1, seg_node.roll(1))
    index = torch.arange(len(seg_node), device=rows.device)
    seg_depth = index - torch.cummax(torch.where(seg_new_row, index, 0), 0).values
    group = _per_node(group_ids[rows], node, k)
    node_id = _per_node(ids, node, k)
    parent, depth = _per_node(seg_parent, seg_node, k), _per_node(seg_depth, seg_node, k)
    for what, per_node, per_segment in (("parent", parent, seg_parent), ("depth", depth, seg_depth)):
        clash = per_node[seg_node] != per_segment
        if clash.any():
            bad = seg_node[clash][0]
            raise ValueError(f"step_group_ids do not form a tree: node {int(node_id[bad])} of group "
                             f"{int(group[bad])} has more than one {what}; give every branch its own node ids")
    return {"rows": rows, "steps": steps, "node": node, "parent": parent, "depth": depth, "group": group}


def _per_node(values: Tensor, nodes: Tensor, k: int) -> Tensor:
    """``[K]`` one value per node (the largest of its entries; callers check they agree)."""
    return torch.zeros(k, dtype=values.dtype, device=values.device).scatter_reduce_(0, nodes, values, "amax",
                                                                                   include_self=False)


def path_prob_values(value: Tensor, parent: Tensor, depth: Tensor, edge_log_prob: Tensor,
                     alpha: float = 1.0) -> Tensor:
    """BranchGRPO's reward fusion: a node with children takes ``sum_c softmax_c(alpha * lp_c) V(c)`` over its children
    ``c`` (``lp_c`` the log-prob of the edge into ``c``), from the deepest nodes up; a leaf keeps ``value``.

    Args:
        value, parent, depth, edge_log_prob: ``[K]`` per node (``parent`` -1 for a root).

    >>> v = path_prob_values(torch.tensor([0.0, 1.0, 3.0]), torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 1]),
    ...                      torch.tensor([0.0, 0.0, float(torch.tensor(3.0).log())]))
    >>> round(v[0].item(), 4)  # weights 1/4 and 3/4: 0.25 * 1 + 0.75 * 3
    2.5
    """
    fused = value.clone()
    for d in range(int(depth.max()), 0, -1):
        child = (depth == d) & (parent >= 0)
        if not child.any():
            continue
        p, logit = parent[child], alpha * edge_log_prob[child]
        top = torch.full_like(value, float("-inf")).scatter_reduce(0, p, logit, "amax", include_self=True)
        w = (logit - top[p]).exp()
        total = torch.zeros_like(value).scatter_add(0, p, w)
        has = torch.zeros_like(value, dtype=torch.bool).scatter(0, p, True)
        fused = torch.where(has, torch.zeros_like(value).scatter_add(0, p, w / total[p] * fused[child]), fused)
    return fused


@register("tree")
def tree(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, step_group_ids: Tensor, log_probs: Tensor = None,
         among: str = "depth", value: str = "mean", alpha: float = 1.0, eps: float = 1e-6, ddof: int = 1,
         std_scope: str = "group", singleton: str = "zero") -> Tensor:
    """Node-value advantage: ``A[i, t] = (V(n) - mean V(n')) / (std + eps)`` over the nodes ``n'`` compared to n.

    Args:
        step_group_ids: ``[B, T]`` int tree node of each position (within its group).
        log_probs: ``[B, T]`` the sampled log-prob of each position; read by ``value="path_prob"`` only.
        among: ``depth`` (all nodes of the group at n's depth) or ``siblings`` (nodes sharing n's parent).
        value: ``mean`` (the mean outcome of the leaves below) or ``path_prob`` (BranchGRPO's fusion: each node the
            ``softmax(alpha * edge log-prob)``-weighted value of its children, :func:`path_prob_values`).
        std_scope: ``group`` (the compared nodes), ``batch`` (all nodes at n's depth in the batch), ``global``
            (all nodes), ``none`` (``V(n) - mean``: SPO's value difference). Means and stds count each node once.
        singleton: what a node with nothing to compare to gets (an unbranched shared prefix; an only child):
            ``zero`` (default: it carries no relative information) or ``raw``. Other options as ``grpo``.

    Without branching (every row its own nodes, rows of equal length) and ``among="depth"`` this is GRPO at every
    step.

    >>> ids = torch.tensor([[0, 1], [0, 1], [0, 2], [0, 2]])  # shared root step, two branches of two leaves
    >>> r = torch.tensor([[0.0, 1.0], [0.0, 3.0], [0.0, 4.0], [0.0, 8.0]]); m = torch.ones(4, 2, dtype=torch.bool)
    >>> tree(r, m, torch.zeros(4).long(), step_group_ids=ids, eps=0.0, ddof=0).tolist()  # V = 2 and 6
    [[0.0, -1.0], [0.0, -1.0], [0.0, 1.0], [0.0, 1.0]]
    """
    nodes = tree_nodes(mask, group_ids, step_group_ids)
    s = scores(rewards, mask)
    # each row counts once per node, however many steps it spends there
    node, row = torch.unique(torch.stack([nodes["node"], nodes["rows"]], dim=1), dim=0).unbind(1)
    values = _per_node(group_stats(s[row], node)[0], node, nodes["parent"].shape[0])  # [K] mean leaf outcome
    if value == "path_prob":
        if log_probs is None:
            raise ValueError("tree with value='path_prob' needs log_probs [B, T] (the sampled log-prob per position)")
        first = torch.full_like(values, len(nodes["node"]), dtype=torch.long).scatter_reduce(
            0, nodes["node"], torch.arange(len(nodes["node"]), device=values.device), "amin")  # a node's first position
        edge = log_probs[nodes["rows"][first], nodes["steps"][first]].to(values.dtype)
        values = path_prob_values(values, nodes["parent"], nodes["depth"], edge, alpha)
    # the root parent (-1) is shared by every group, hence the group in the key
    keys = torch.stack([nodes["group"], nodes["parent" if among == "siblings" else "depth"]], dim=1)
    adv = normalize(values, keys, std_scope=std_scope, eps=eps, ddof=ddof, singleton=singleton,
                    batch_keys=nodes["depth"])
    return at_positions(adv[nodes["node"]], mask, nodes["rows"], nodes["steps"])
