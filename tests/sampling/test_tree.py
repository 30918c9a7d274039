"""The tree sampler on a known velocity field: a linear tree is the plain sampler, leaves share their prefix bit for
bit, a node's noise depends on (tree seed, path) only, every frontier depth is one model call, each state is
stored once, and the NFE shares add up to the evaluations made."""

import pytest
import torch

from flowrl.sampling.sampler import sample
from flowrl.sampling.tree import TreeShape, sample_trees

T = 10
SIGMAS = torch.linspace(1, 0, T + 1)
SHAPE = (1, 2, 2)


def velocity(z, sigma, rows):
    return -z + sigma.view(-1, 1, 1, 1) + 0.1 * rows.view(-1, 1, 1, 1).float()


def binary_window(w=2, d=4, beta=0.5):
    """Dynamic-TreeRPO's shape: ODE prefix, a binary split at every step of [w, w + d), ODE completion after."""
    inside = [w <= k < w + d for k in range(T)]
    return TreeShape(splits=tuple(2 if i else 1 for i in inside), sde=tuple(inside), side=(0,) * T, stop=w + d,
                     noise_scale=tuple(1 + beta * (k - w) / (d - 1) if i else 1.0 for k, i in enumerate(inside)))


def side_branches(k=6):
    """TempFlow-GRPO's shape: an ODE trunk with ``k`` one-step SDE branches at each of its first 9 steps."""
    return TreeShape(splits=(1,) * T, sde=(False,) * T, noise_scale=(1.0,) * T, side=(k,) * 9 + (0,), stop=9,
                     frontier_leaves=False)


def test_a_tree_without_branches_is_the_plain_sampler():
    plain = lambda z, s, rows: velocity(z, s, torch.zeros(len(z)))  # noqa: E731
    line = TreeShape(splits=(1,) * T, sde=(False,) * T, noise_scale=(1.0,) * T, side=(0,) * T, stop=T)
    tree = sample_trees(velocity, torch.tensor([3]), SHAPE, SIGMAS, line)
    latents, _ = sample(plain, torch.tensor([3]), SIGMAS, SHAPE, "ode")
    assert torch.equal(tree.final[0], latents[0, -1])
    assert torch.equal(tree.node_latents[tree.state_index[0, :T].long()], latents[0, :T])


@pytest.mark.parametrize("shape", [binary_window(), side_branches()], ids=["tree", "side"])
def test_leaves_share_their_prefix_and_a_nodes_noise_depends_on_its_seed_and_path_only(shape):
    both = sample_trees(velocity, torch.tensor([3, 4]), SHAPE, SIGMAS, shape)
    alone = sample_trees(lambda z, s, r: velocity(z, s, r + 1), torch.tensor([4]), SHAPE, SIGMAS, shape)
    mine = both.tree == 1  # tree 1 of the pair is the lone tree (its velocity sees row 1 there too)
    assert torch.equal(both.final[mine], alone.final) and torch.equal(both.log_probs[mine], alone.log_probs)
    assert torch.equal(both.node_ids[mine], alone.node_ids)
    # leaves of one tree read the same stored state wherever their paths agree: the prefix exists once
    a, b = (both.tree == 0).nonzero().flatten()[:2]
    split = int((both.node_ids[a] != both.node_ids[b]).nonzero()[0])  # the step at which their paths part
    assert torch.equal(both.state_index[a, :split + 1], both.state_index[b, :split + 1])
    after_a, after_b = both.state_index[a, split + 1:], both.state_index[b, split + 1:]
    kept = after_a >= 0  # states inside an ODE completion are not kept (-1)
    assert torch.equal(kept, after_b >= 0) and (after_a[kept] != after_b[kept]).all()
    assert len(set(both.node_ids[:, -1].tolist())) == shape.leaves() * 2  # every leaf its own last node


def test_each_depth_is_one_model_call_and_nfe_shares_add_up():
    calls = []

    def counted(z, sigma, rows):
        calls.append(len(z))
        return velocity(z, sigma, rows)

    w, d = 2, 4
    trees = sample_trees(counted, torch.tensor([3, 4]), SHAPE, SIGMAS, binary_window(w, d))
    frontier = calls[:w + d]  # one call per step until the window ends, then one batched completion
    assert frontier == [2, 2, 2, 4, 8, 16]
    per_tree = w + sum(2 ** level for level in range(d)) + 2 ** d * (T - w - d)  # 2 + 15 + 64
    assert trees.evaluations == 2 * per_tree == sum(calls)
    assert torch.allclose(trees.nfe.sum(), torch.tensor(float(2 * per_tree)))
    side = sample_trees(velocity, torch.tensor([5]), SHAPE, SIGMAS, side_branches(6))
    assert side.evaluations == 9 + 6 * sum(9 - k for k in range(9)) == 279  # TempFlow-GRPO at T=10, K=6


def test_states_are_stored_once_and_only_stochastic_steps_carry_log_probs():
    trees = sample_trees(velocity, torch.tensor([3]), SHAPE, SIGMAS, binary_window())
    index = trees.state_index[trees.state_index >= 0]
    assert index.unique().numel() == len(trees.node_latents)  # every stored state is some leaf's state
    unique_states = torch.unique(trees.node_latents.flatten(1), dim=0)
    assert len(unique_states) == len(trees.node_latents)  # and no state is stored twice
    assert torch.equal(trees.log_probs != 0, trees.sde_mask)
    assert trees.sde_mask[:, 2:6].all() and not trees.sde_mask[:, :2].any() and not trees.sde_mask[:, 6:].any()


def test_impossible_shapes_are_named():
    bad = TreeShape(splits=(2,) + (1,) * (T - 1), sde=(False,) * T, noise_scale=(1.0,) * T, side=(0,) * T, stop=T)
    assert "every split step must be an SDE step" in bad.problems()[0]
    nothing = TreeShape(splits=(1,) * T, sde=(False,) * T, noise_scale=(1.0,) * T, side=(0,) * T, stop=T,
                        frontier_leaves=False)
    assert "needs side branches to score" in nothing.problems()[0]
