"""Reward aggregation modes against hand-computed values; non-finite scores are masked, never zeroed."""

import math

import pytest
import torch

from flowrl.rewards.aggregate import aggregate, gdpo, group_normalized

NAN = float("nan")


def test_sum_is_the_weighted_raw_sum():
    scores = {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([10.0, 0.0, -10.0])}
    total, valid = aggregate("sum", scores, {"a": 2.0, "b": 0.5}, torch.tensor([0, 0, 1]))
    # 2*1 + 0.5*10 = 7; 2*2 + 0 = 4; 2*3 - 5 = 1
    assert total.tolist() == [7.0, 4.0, 1.0] and valid.all()


def test_advantage_sum_normalises_each_reward_within_its_group():
    # group 0 = rows 0,1; group 1 = rows 2,3. ddof=0, eps=0 for round numbers.
    # a: group 0 [1, 3] -> mean 2, std 1 -> [-1, 1]; group 1 [5, 5] -> std 0 -> [0, 0]
    # b: group 0 [0, 100] -> [-1, 1]; group 1 [10, 30] -> mean 20, std 10 -> [-1, 1]
    scores = {"a": torch.tensor([1.0, 3.0, 5.0, 5.0]), "b": torch.tensor([0.0, 100.0, 10.0, 30.0])}
    total, _ = aggregate("advantage_sum", scores, {"a": 1.0, "b": 0.5}, torch.tensor([0, 0, 1, 1]),
                         eps=0.0, ddof=0)
    # 1*[-1, 1, 0, 0] + 0.5*[-1, 1, -1, 1]
    assert total.tolist() == [-1.5, 1.5, -0.5, 0.5]


def test_advantage_sum_is_scale_free_while_sum_is_not():
    ids = torch.tensor([0, 0, 0])
    small, big = {"a": torch.tensor([1.0, 2.0, 3.0])}, {"a": torch.tensor([100.0, 200.0, 300.0])}
    assert torch.allclose(aggregate("advantage_sum", small, {"a": 1.0}, ids, eps=0.0)[0],
                          aggregate("advantage_sum", big, {"a": 1.0}, ids, eps=0.0)[0])


def test_gdpo_batch_normalises_the_summed_group_advantages():
    # from the advantage_sum case above: A = [-1.5, 1.5, -0.5, 0.5]; mean 0;
    # unbiased batch std = sqrt((2.25 + 2.25 + 0.25 + 0.25) / 3) = sqrt(5/3)
    scores = {"a": torch.tensor([1.0, 3.0, 5.0, 5.0]), "b": torch.tensor([0.0, 100.0, 10.0, 30.0])}
    weights, ids = {"a": 1.0, "b": 0.5}, torch.tensor([0, 0, 1, 1])
    out = gdpo(scores, weights, ids, eps=0.0, ddof=0)
    # ddof applies to both stages: population std of A = sqrt(5/4)
    expected = [v / math.sqrt(5 / 4) for v in (-1.5, 1.5, -0.5, 0.5)]
    assert out.tolist() == pytest.approx(expected, abs=1e-6)
    # the published defaults: ddof=1 and eps=1e-4 at both stages (NVlabs/GDPO TRL trainer)
    a = torch.tensor([1.0, 3.0, 5.0, 5.0])
    a_g = [(1 - 2) / (math.sqrt(2) + 1e-4), (3 - 2) / (math.sqrt(2) + 1e-4), 0.0, 0.0]
    b_g = [(0 - 50) / (math.sqrt(5000) + 1e-4), (100 - 50) / (math.sqrt(5000) + 1e-4),
           (10 - 20) / (math.sqrt(200) + 1e-4), (30 - 20) / (math.sqrt(200) + 1e-4)]
    s = [x + 0.5 * y for x, y in zip(a_g, b_g)]
    mean = sum(s) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in s) / 3)
    out = aggregate("gdpo", {"a": a, "b": scores["b"]}, weights, ids)[0]
    assert out.tolist() == pytest.approx([(v - mean) / (std + 1e-4) for v in s], abs=1e-5)


def test_group_of_one_gets_zero_not_nan():
    assert group_normalized(torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1])).tolist()[0] == 0.0


@pytest.mark.parametrize("mode", ["sum", "advantage_sum", "gdpo"])
def test_non_finite_rows_are_masked_and_excluded_from_statistics(mode):
    ids = torch.tensor([0, 0, 0, 1, 1])
    clean = {"a": torch.tensor([1.0, 3.0, 2.0, 7.0]), "b": torch.tensor([0.0, 1.0, 4.0, 2.0])}
    dirty = {"a": torch.tensor([1.0, 3.0, NAN, 2.0, 7.0]), "b": torch.tensor([0.0, 1.0, 5.0, 4.0, 2.0])}
    weights = {"a": 1.0, "b": 2.0}
    total, valid = aggregate(mode, dirty, weights, ids)
    assert valid.tolist() == [True, True, False, True, True]
    assert total[2] == 0.0  # held out of the loss by `valid`, and not part of anyone's statistics:
    expected, _ = aggregate(mode, clean, weights, torch.tensor([0, 0, 1, 1]))
    assert torch.allclose(total[valid], expected)


def test_a_reward_failing_on_the_whole_batch_is_named():
    scores = {"good": torch.ones(3), "broken": torch.full((3,), float("inf"))}
    with pytest.raises(ValueError, match=r"\['broken'\]"):
        aggregate("gdpo", scores, {"good": 1.0, "broken": 1.0}, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="reward_aggregation='mean'"):
        aggregate("mean", scores, {"good": 1.0, "broken": 1.0}, torch.zeros(3, dtype=torch.long))
