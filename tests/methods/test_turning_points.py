"""TP-GRPO step rewards: the issue's worked examples, each rule and option by hand, and the paper's invariants."""

import pytest
import torch

from flowrl import advantages
from flowrl.advantages.turning_points import (aggregated_rewards, balance, incremental_rewards, tp_step_rewards,
                                           turning_points)

EX1 = [0.50, 0.45, 0.60, 0.55, 0.70]  # rising trend, TP at j=1
EX2 = [0.80, 0.85, 0.70, 0.72, 0.60]  # falling trend, TP at j=1
EX3 = [0.30, 0.40, 0.35, 0.50, 0.52]  # TPs at j=0 (consistent first step) and j=2


def rewards_of(*rows):
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("row, expected, points", [
    (EX1, [-0.05, 0.25, -0.05, 0.15], [False, True, False, False]),
    (EX2, [0.05, -0.25, 0.02, -0.12], [False, True, False, False]),
    (EX3, [0.22, -0.05, 0.17, 0.02], [True, False, True, False]),
])
def test_issue_examples_one_trajectory(row, expected, points):
    r, tp = tp_step_rewards(rewards_of(row))
    assert torch.allclose(r[0], torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert tp[0].tolist() == points


def test_issue_examples_balanced_as_one_batch():
    r, tp = tp_step_rewards(rewards_of(EX1, EX2, EX3))
    # TPs +0.25, -0.25, +0.22, +0.17: one of each sign stays (the largest |agg|); the third row reverts to d
    expected = rewards_of([-0.05, 0.25, -0.05, 0.15], [0.05, -0.25, 0.02, -0.12], [0.10, -0.05, 0.15, 0.02])
    assert torch.allclose(r, expected, atol=1e-12)
    assert tp.nonzero().tolist() == [[0, 1], [1, 1]]
    unbalanced, tp_all = tp_step_rewards(rewards_of(EX1, EX2, EX3), balanced=False)
    assert tp_all.sum() == 4 and torch.allclose(unbalanced[2], rewards_of([0.22, -0.05, 0.17, 0.02])[0])


def test_per_step_group_advantages_of_the_balanced_batch():
    r, _ = tp_step_rewards(rewards_of(EX1, EX2, EX3))
    adv = advantages.compute("step_grpo", r, torch.ones_like(r, dtype=torch.bool), torch.zeros(3, dtype=torch.long),
                             eps=1e-4, ddof=0, std_scope="group")
    expected = torch.tensor([[-1.3342, 1.2971, -1.0848, 1.2083], [0.2668, -1.1350, -0.2411, -1.2385],
                             [1.0673, -0.1621, 1.3259, 0.0302]], dtype=torch.float64)
    assert torch.allclose(adv, expected, atol=1e-4)


def test_incremental_and_aggregated_rewards():
    r = rewards_of(EX1)
    assert torch.allclose(incremental_rewards(r), rewards_of([-0.05, 0.15, -0.05, 0.15]))
    assert torch.allclose(aggregated_rewards(r), rewards_of([0.20, 0.25, 0.10, 0.15]))
    # agg_j is the sum of the increments from j on
    assert torch.allclose(aggregated_rewards(r), incremental_rewards(r).flip(1).cumsum(1).flip(1))


def test_constraint_of_definition_5_1():
    # j=1 flips the trend (s = [-1, +1, -1, -1]) but R_4 - R_2 < 0: what follows undoes it
    r = rewards_of([0.50, 0.40, 0.60, 0.55, 0.52])
    assert turning_points(r).tolist() == [[False, False, False, False]]
    off = turning_points(r, constraint=False)
    assert off.tolist() == [[False, True, False, False]]
    rewards, _ = tp_step_rewards(r, constraint=False)
    assert rewards[0, 1].item() == pytest.approx(0.12)  # agg_1 = 0.52 - 0.40 replaces d_1 = 0.20
    # without the constraint the last step of EX1 is a turning point too; its agg equals d
    assert turning_points(rewards_of(EX1), constraint=False).tolist() == [[False, True, False, True]]


def test_first_step_rules():
    # d_0 = +0.3 agrees with the trend g = +0.1, but R_n - R_1 = -0.2: plain says TP, consistent does not
    r = rewards_of([0.5, 0.8, 0.7, 0.6])
    assert turning_points(r, first_step="plain")[0, 0] and not turning_points(r, first_step="consistent")[0, 0]
    plain, _ = tp_step_rewards(r, first_step="plain")
    consistent, _ = tp_step_rewards(r)
    assert plain[0, 0].item() == pytest.approx(0.1) and consistent[0, 0].item() == pytest.approx(0.3)
    none, tp = tp_step_rewards(rewards_of(EX3), first_step="none")
    assert not tp[0, 0] and none[0, 0].item() == pytest.approx(0.10) and tp[0, 2]


def test_balance_ties_zero_and_one_sided():
    tp = torch.tensor([[True, True, False], [True, True, False]])
    agg = torch.tensor([[0.2, -0.1, 0.9], [0.2, 0.0, -0.3]])
    # positives 0.2 (row 0), 0.2 (row 1): equal |agg|, the earlier stays; the zero TP is neither sign and stays
    assert balance(tp, agg).tolist() == [[True, True, False], [False, True, False]]
    one_sided = torch.tensor([[True, True, True]])
    assert torch.equal(balance(one_sided, torch.tensor([[0.1, 0.2, 0.3]])), one_sided)


def test_invalid_rows_take_no_part_in_balancing():
    batch = rewards_of(EX1, EX2)
    batch[1, 2] = float("nan")
    r, tp = tp_step_rewards(batch)
    assert tp.nonzero().tolist() == [[0, 1]] and r[0, 1].item() == pytest.approx(0.25)
    _, tp = tp_step_rewards(rewards_of(EX1, EX2), valid=torch.tensor([True, False]))
    assert tp.nonzero().tolist() == [[0, 1]]


def test_invariants_on_random_batches():
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(400, 7, generator=gen, dtype=torch.float64)
    d, agg = incremental_rewards(r), aggregated_rewards(r)
    tp = turning_points(r)
    # App. C: under the constraint a turning point's agg has d's sign and a larger magnitude
    assert tp.any() and (torch.sign(agg[tp]) == torch.sign(d[tp])).all() and (agg[tp].abs() > d[tp].abs()).all()
    assert not tp[:, -1].any()  # the constraint rules out the last step
    consistent, plain = turning_points(r)[:, 0], turning_points(r, first_step="plain")[:, 0]
    assert (plain | ~consistent).all() and (plain & ~consistent).any()  # consistent is the stricter rule
    kept = balance(tp, agg)
    assert (kept <= tp).all()
    pos, neg = (tp & (agg > 0)).sum(), (tp & (agg < 0)).sum()
    assert (kept & (agg > 0)).sum() == (kept & (agg < 0)).sum() == min(pos, neg)
    # the kept ones of each sign are the largest by |agg|
    for sign in (1, -1):
        side = tp & (torch.sign(agg) == sign)
        if (side & ~kept).any():
            assert agg[kept & side].abs().min() >= agg[side & ~kept].abs().max()


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="first_step='first'"):
        turning_points(rewards_of(EX1), first_step="first")
    with pytest.raises(ValueError, match=r"\[B, n\+1\]"):
        turning_points(torch.zeros(3, 1))
