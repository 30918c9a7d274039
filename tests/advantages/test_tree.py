"""Tree advantages: node values as mean leaf outcomes, depth-wise and sibling normalisation by hand, segments,
reduction to GRPO without branching, and errors for ids that are not a tree."""

import pytest
import torch

from flowrl import advantages as adv

# one group of 4 leaves, T = 3: a shared root step (node 0), two branches (1: rows 0-1, 2: rows 2-3), four leaves
IDS = torch.tensor([[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]])
R = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 3.0], [0.0, 0.0, 4.0], [0.0, 0.0, 8.0]])  # leaf outcomes 1 3 4 8
M = torch.ones(4, 3, dtype=torch.bool)
G = torch.zeros(4).long()


def run(**options):
    return adv.compute("tree", R, M, G, step_group_ids=IDS, eps=0.0, ddof=0, **options)


def test_depth_wise_normalisation():
    # V: root 4 (alone at depth 0 -> 0); branches 2, 6 -> [-1, 1]; leaves 1 3 4 8: mean 4, std sqrt(26/4)
    s = 6.5 ** -0.5
    expected = [[0, -1, -3 * s], [0, -1, -1 * s], [0, 1, 0], [0, 1, 4 * s]]
    assert run().tolist() == [pytest.approx(row, abs=1e-6) for row in expected]


def test_sibling_normalisation_and_spo_value_differences():
    # siblings: branches {1, 2} under the root -> [-1, 1]; leaves {3, 4} (1, 3) and {5, 6} (4, 8) -> [-1, 1] each
    assert run(among="siblings").tolist() == [[0, -1, -1], [0, -1, 1], [0, 1, -1], [0, 1, 1]]
    # no std: V(child) - V(parent), the parent's value being the mean of its children (SPO "rloo")
    assert run(among="siblings", std_scope="none").tolist() == [[0, -2, -1], [0, -2, 1], [0, 2, -2], [0, 2, 2]]


def test_a_node_spanning_several_steps_is_one_segment():
    ids = torch.tensor([[0, 0, 1], [0, 0, 2]])  # the root spans steps 0-1; the leaves sit at depth 1
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    out = adv.tree(r, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2).long(), step_group_ids=ids, eps=0.0,
                   ddof=0)
    assert out.tolist() == [[0, 0, -1], [0, 0, 1]]
    nodes = adv.tree_nodes(torch.ones(2, 3, dtype=torch.bool), torch.zeros(2).long(), ids)
    assert nodes["depth"].tolist() == [0, 1, 1] and nodes["parent"].tolist() == [-1, 0, 0]


def test_tree_without_branching_is_grpo():
    gen = torch.Generator().manual_seed(0)
    r, g = torch.randn(12, 5, generator=gen), torch.arange(12) // 4
    m = torch.ones(12, 5, dtype=torch.bool)  # equal lengths: a shorter row would leave its depth's peers fewer
    own = torch.arange(60).view(12, 5)  # every row its own chain of nodes
    out = adv.compute("tree", r, m, g, step_group_ids=own, singleton="raw")
    assert torch.allclose(out, adv.compute("grpo", r, m, g), atol=1e-6)


def test_ids_are_scoped_within_groups_and_rows_permute():
    ids = torch.cat([IDS, IDS])  # the same ids reused by a second group
    r, g = torch.cat([R, 2 * R]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = adv.tree(r, torch.ones(8, 3, dtype=torch.bool), g, step_group_ids=ids, eps=0.0, ddof=0)
    assert torch.allclose(out[:4], run(), atol=1e-6) and torch.allclose(out[4:], run(), atol=1e-6)
    perm = torch.tensor([2, 0, 3, 1, 5, 7, 4, 6])
    moved = adv.tree(r[perm], torch.ones(8, 3, dtype=torch.bool), g[perm], step_group_ids=ids[perm], eps=0.0, ddof=0)
    assert torch.allclose(moved, out[perm], atol=1e-6)


def test_ids_that_are_not_a_tree_are_refused():
    with pytest.raises(ValueError, match="do not form a tree: node 1 of group 0 has more than one parent"):
        adv.tree(R[:2, :2], M[:2, :2], G[:2], step_group_ids=torch.tensor([[0, 1], [2, 1]]))
    with pytest.raises(ValueError, match="node id >= 0"):
        adv.tree(R, M, G, step_group_ids=torch.full((4, 3), -1))
    with pytest.raises(ValueError, match="'tree' needs step_group_ids"):
        adv.compute("tree", R, M, G)
