"""Max-variance down-sampling (PODS): hand-computed subsets, ties, groups of different sizes, and the paper's claim
checked against brute force over every size-m subset."""

import itertools

import pytest
import torch

from flowrl.advantages import max_variance_subset


def kept(scores, groups, m):
    return max_variance_subset(torch.tensor(scores), torch.tensor(groups), m).nonzero().flatten().tolist()


def test_hand_computed_subsets():
    # {2, 10}: var 16, {0, 10}: var 25, {0, 1}: var 0.25
    assert kept([0.0, 1.0, 2.0, 10.0], [0, 0, 0, 0], 2) == [0, 3]
    # m = 3 of [0, 1, 2, 10]: {0, 1, 10} (var 20.2) beats {0, 2, 10} (var 18.7) and {1, 2, 10}
    assert kept([0.0, 1.0, 2.0, 10.0], [0, 0, 0, 0], 3) == [0, 1, 3]
    # rows of a group need not be adjacent, nor ids dense: group 7 = rows 0, 2, 4 keeps {5, 0}; group -1 = rows 1, 3, 5
    # (scores 1, 1, 9): {1, 9} either way, the candidate of the m highest (k = 0: rows 3, 5) first
    assert kept([5.0, 1.0, 4.0, 1.0, 0.0, 9.0], [7, -1, 7, -1, 7, -1], 2) == [0, 3, 4, 5]


def test_equal_scores_are_broken_by_index():
    # every candidate has variance 0: the first (k = 0, the m highest) wins; equal scores keep their index order
    assert kept([0.5] * 5, [0] * 5, 2) == [3, 4]
    # binary rewards: sorted rows 1, 3, 5 (0s) then 0, 2, 4 (1s); two of each (k = 2) has the largest variance
    assert kept([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], [0] * 6, 4) == [1, 2, 3, 4]


def test_groups_of_m_rows_or_fewer_keep_every_row():
    scores, groups = [3.0, 1.0, 2.0, 0.0, 4.0, 8.0], [0, 1, 1, 2, 2, 2]  # sizes 1, 2, 3
    assert kept(scores, groups, 2) == [0, 1, 2, 3, 5]  # group 2: {0, 8}
    assert kept(scores, groups, 3) == [0, 1, 2, 3, 4, 5]


def test_distinct_scores_give_the_same_rows_whatever_their_order_in_the_batch():
    scores, groups = torch.tensor([0.2, 0.9, 0.3, 0.4, 0.8, 0.1, 0.5]), torch.tensor([0, 0, 0, 1, 1, 1, 1])
    perm = torch.tensor([5, 3, 0, 6, 4, 1, 2])
    assert torch.equal(max_variance_subset(scores, groups, 2)[perm], max_variance_subset(scores[perm], groups[perm], 2))


@pytest.mark.parametrize("seed", range(4))
def test_the_subset_has_the_largest_variance_of_every_size_m_subset(seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = [3, 5, 6, 8]
    groups = torch.cat([torch.full((n,), g) for g, n in enumerate(sizes)])
    # few distinct values in two of the groups: ties between rows and between candidates
    scores = torch.cat([torch.randn(3, generator=gen), torch.randint(0, 2, (5,), generator=gen).float(),
                        torch.randint(0, 3, (6,), generator=gen).float() / 2, torch.rand(8, generator=gen)])
    for m in (2, 3, 4):
        mask = max_variance_subset(scores, groups, m)
        for g, n in enumerate(sizes):
            mine = scores[groups == g].double()
            if n <= m:
                assert mask[groups == g].all()
                continue
            assert int(mask[groups == g].sum()) == m
            best = max(mine[list(c)].var(unbiased=False).item() for c in itertools.combinations(range(n), m))
            assert mine[mask[groups == g]].var(unbiased=False).item() == pytest.approx(best, abs=1e-12)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="m=0"):
        max_variance_subset(torch.zeros(2), torch.zeros(2, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        max_variance_subset(torch.tensor([0.0, float("nan")]), torch.zeros(2, dtype=torch.long), 1)
