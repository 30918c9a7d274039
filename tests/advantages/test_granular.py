"""G²RPO's advantages and cost, held to bcmi/Granular-GRPO fastvideo/train_g2rpo_hps.py (train_one_step: the loops
over samples["all_rewards"] / ["all_rewards_2"], group_rewards.std(dim=0) + 1e-8, summed; adv_clip_max in the loss)
and scripts/finetune/finetune_g2rpo_hps.sh (16 steps, 12 per group, eta_step_list 0..7, granularities 1 and 2)."""

import math

import pytest
import torch

from flowrl.advantages import compute, granular_evaluations, granular_grpo

# two prompts x 3 members, K = 2 trained steps, columns (g=1 HPS, g=2 HPS, g=1 CLIP, g=2 CLIP)
TABLE = torch.tensor([
    [[0.20, 0.22, 0.30, 0.31], [0.25, 0.20, 0.31, 0.30]],
    [[0.24, 0.20, 0.33, 0.30], [0.21, 0.21, 0.30, 0.32]],
    [[0.22, 0.27, 0.27, 0.35], [0.29, 0.25, 0.29, 0.28]],
    [[0.50, 0.50, 0.10, 0.12], [0.40, 0.45, 0.11, 0.10]],
    [[0.60, 0.52, 0.12, 0.10], [0.44, 0.41, 0.14, 0.13]],
    [[0.70, 0.51, 0.14, 0.14], [0.48, 0.49, 0.10, 0.16]],
], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])
MASK = torch.ones(6, 2, dtype=torch.bool)


def authors_advantages(table, group_size):
    """The authors' loop, per column and per group of num_generations consecutive rows (float64 here)."""
    total = torch.zeros(table.shape[:2], dtype=table.dtype)
    for c in range(table.shape[-1]):
        rewards = table[..., c]
        for i in range(table.shape[0] // group_size):
            group = rewards[i * group_size:(i + 1) * group_size]
            total[i * group_size:(i + 1) * group_size] += (group - group.mean(0)) / (group.std(0) + 1e-8)
    return total


def test_sum_of_columns_matches_the_authors_loop():
    got = granular_grpo(TABLE, MASK, GROUPS)
    torch.testing.assert_close(got.double(), authors_advantages(TABLE, 3), rtol=0, atol=1e-6)


def test_one_column_by_hand():
    # step 0, prompt 0, HPS at g = 1: rewards 0.20, 0.24, 0.22: mean 0.22, unbiased std sqrt((4+4+0)e-4 / 2) = 0.02
    got = granular_grpo(TABLE[..., :1], MASK, GROUPS)
    torch.testing.assert_close(got[:3, 0], torch.tensor([-1.0, 1.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-6)


def test_adv_clip_applies_to_the_sum():
    # each column of a group of 3 reaches at most (n - 1) / sqrt(n) = 1.1547; four columns sum past 2 but not 5
    raw, clipped = granular_grpo(TABLE, MASK, GROUPS), granular_grpo(TABLE, MASK, GROUPS, clip=2.0)
    assert raw.abs().max() > 2.0
    torch.testing.assert_close(clipped, raw.clamp(-2.0, 2.0))


def test_one_granularity_one_reward_is_per_step_grpo():
    # with a single column G²RPO is GRPO at each trained step (over the group), unbiased std, +1e-8
    one = TABLE[..., 0]
    got = granular_grpo(one, MASK, GROUPS)
    for k in range(2):
        step = compute("grpo", one[:, k:k + 1], MASK[:, :1], GROUPS, eps=1e-8, ddof=1)
        torch.testing.assert_close(got[:, k:k + 1], step, rtol=0, atol=1e-6)
    torch.testing.assert_close(got, compute("step_grpo@g2rpo", one, MASK, GROUPS))


def test_equal_rewards_give_no_advantage():
    # the authors' float32 std of equal rewards is rounding noise over 1e-8; flowrl normalises in float64
    flat = torch.full((6, 2, 4), 0.1)
    assert granular_grpo(flat, MASK, GROUPS).abs().max() < 1e-6


def test_published_cost_and_small_grids_by_hand():
    assert granular_evaluations(16, 12, list(range(8)), [1, 2]) == 1792  # 16 + 12 * 148
    # T = 4, G = 2, k = 0: 1 + 3 + ceil(3/2) = 6; k = 2: 1 + 1 + 1 = 3 -> 4 + 2 * 9 = 22
    assert granular_evaluations(4, 2, [0, 2], [1, 2]) == 22
    # one granularity g = 1: one SDE step + the remaining T - 1 - k ODE steps = T - k per member and step
    assert granular_evaluations(10, 4, [3], [1]) == 10 + 4 * (10 - 3)
    assert granular_evaluations(16, 12, [0], [1, 2]) == 16 + 12 * (1 + 15 + math.ceil(15 / 2))


@pytest.mark.parametrize("bad", [dict(trained_steps=[15]), dict(granularities=[0])])
def test_cost_refuses_impossible_grids(bad):
    args = dict(num_steps=16, group_size=12, trained_steps=[0], granularities=[1]) | bad
    with pytest.raises(ValueError, match="must lie in"):
        granular_evaluations(**args)


def test_table_shape_is_checked():
    with pytest.raises(ValueError, match=r"\[B, K, C\]"):
        granular_grpo(TABLE, torch.ones(6, 3, dtype=torch.bool), GROUPS)


def test_leaves_of_a_tree_give_the_authors_advantages():
    # the same table as leaves of a tree rollout: one leaf per (member, step, granularity), shuffled, scored by two
    # rewards; the leaves of a branch (member, step) share its node id, and each gets the branch's summed advantage
    from flowrl.advantages import granular_leaf_advantages
    member, step, grain = torch.meshgrid(torch.arange(6), torch.arange(2), torch.arange(2), indexing="ij")
    member, step, grain = member.reshape(-1), step.reshape(-1), grain.reshape(-1)
    order = torch.randperm(len(member), generator=torch.Generator().manual_seed(0))
    member, step, grain = member[order], step[order], grain[order]
    scores = {"hps": TABLE[member, step, grain], "clip": TABLE[member, step, 2 + grain]}
    mask = torch.nn.functional.one_hot(step, 2).bool()
    nodes = (100 + 10 * member + step)[:, None].expand(-1, 2)  # one node per branch, as the tree sampler's ids
    got, ok = granular_leaf_advantages(scores, {"hps": 1.0, "clip": 1.0}, mask, grain + 1, nodes, GROUPS[member],
                                       torch.ones(len(member), dtype=torch.bool), clip=5.0)
    expected = authors_advantages(TABLE, 3)[member, step].float()
    torch.testing.assert_close(got[mask], expected, rtol=0, atol=1e-5)
    assert ok.all() and not got[~mask].any()
    # a reward left unscored on one leaf takes its branch out of the statistics (0, flagged), not the whole group
    scores["clip"][0] = float("nan")
    _, ok = granular_leaf_advantages(scores, {"hps": 1.0, "clip": 1.0}, mask, grain + 1, nodes, GROUPS[member],
                                     torch.ones(len(member), dtype=torch.bool))
    same_branch = (member == member[0]) & (step == step[0])
    assert torch.equal(ok, ~same_branch)
