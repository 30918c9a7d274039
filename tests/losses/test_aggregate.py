"""Loss aggregation modes against hand-computed numbers, with a hole, a padded row, an empty row and nan padding."""

import math

import pytest
import torch

from flowrl.losses import AGGREGATIONS, aggregate

NAN = float("nan")
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [NAN, NAN, NAN]])
MASK = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 0, 0]]).bool()  # a hole, a full row, an empty (padded) row


def test_each_mode_by_hand():
    # valid: row 0 -> 1, 3 (sum 4, 2 tokens); row 1 -> 4, 5, 6 (sum 15, 3 tokens); row 2 empty (not counted)
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(19 / 5)  # 19 / 5 tokens
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(9.5)  # (4 + 15) / 2 rows
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(3.5)  # (4/2 + 15/3) / 2
    # Dr. GRPO: 19 / T (= 3); verl b178a3cd stops there, TRL also divides by the rows
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(19 / 3)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", divide_by_rows=True).item() == pytest.approx(19 / 6)
    # TRL: / (B * max_completion_length) with B = 3 rows and max_completion_length = 10
    trl = aggregate(LOSS, MASK, "seq-mean-token-sum-norm", divide_by_rows=True, loss_scale_factor=10, num_rows=3)
    assert trl.item() == pytest.approx(19 / 30)


def test_global_denominators():
    # gradient accumulation: the denominators of the whole batch, not the micro-batch
    assert aggregate(LOSS, MASK, "token-mean", num_tokens=10).item() == pytest.approx(1.9)
    assert aggregate(LOSS, MASK, "seq-mean-token-mean", num_rows=4).item() == pytest.approx(7 / 4)


def test_gradient_reaches_valid_positions_only():
    loss = LOSS.clone().requires_grad_(True)
    aggregate(loss, MASK, "seq-mean-token-mean").backward()
    # d/dL_it = 1 / (L_i * rows): row 0 -> 1/(2*2) = 0.25, row 1 -> 1/(3*2) = 1/6; masked (and nan) -> 0
    expected = torch.tensor([[0.25, 0.0, 0.25], [1 / 6] * 3, [0.0] * 3])
    assert torch.allclose(loss.grad, expected)


def test_dr_grpo_without_row_division_scales_with_the_micro_batch():
    # duplicating the rows doubles verl's seq-mean-token-sum-norm; dividing by rows (TRL) is invariant
    loss, mask = LOSS[:2], MASK[:2]
    twice_loss, twice_mask = torch.cat([loss, loss]), torch.cat([mask, mask])
    verl = [aggregate(x, m, "seq-mean-token-sum-norm") for x, m in ((loss, mask), (twice_loss, twice_mask))]
    trl = [aggregate(x, m, "seq-mean-token-sum-norm", divide_by_rows=True)
           for x, m in ((loss, mask), (twice_loss, twice_mask))]
    assert verl[1].item() == pytest.approx(2 * verl[0].item()) and trl[1].item() == pytest.approx(trl[0].item())
    for mode in AGGREGATIONS[:3]:  # the mean modes are invariant too
        assert aggregate(twice_loss, twice_mask, mode).item() == pytest.approx(aggregate(loss, mask, mode).item())


def test_empty_mask_gives_zero_not_nan():
    for mode in AGGREGATIONS:
        assert aggregate(torch.ones(2, 2), torch.zeros(2, 2).bool(), mode).item() == 0
    assert not math.isnan(aggregate(LOSS[2:], MASK[2:], "token-mean").item())


def test_bad_modes_and_options_fail_clearly():
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'seq-mean'; choose one of \['token-mean'"):
        aggregate(LOSS, MASK, "seq-mean")
    with pytest.raises(ValueError, match="apply to 'seq-mean-token-sum-norm' only"):
        aggregate(LOSS, MASK, "token-mean", divide_by_rows=True)
    with pytest.raises(ValueError, match="num_tokens applies to 'token-mean' only"):
        aggregate(LOSS, MASK, "seq-mean-token-mean", num_tokens=3)
    with pytest.raises(ValueError, match="loss_scale_factor=0 must be > 0"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=0)
