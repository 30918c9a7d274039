"""DiffusionNFT's loss, optimality mapping and old-policy decay against hand-computed values."""

import pytest
import torch

from flowrl.losses.nft import ADVANTAGE_MODES, nft_loss, old_decay, optimality_probability

one = lambda value: torch.tensor([[value]])  # noqa: E731  a single row of a single dimension


def test_optimality_probability_by_hand_in_every_mode():
    a = torch.tensor([7.0, 2.5, 0.0, -1.0, -6.0])
    expect = {
        "all": [1.0, 0.75, 0.5, 0.4, 0.0],  # clip to 5, then A / 5 / 2 + 0.5
        "positive_only": [1.0, 0.75, 0.5, 0.5, 0.5],  # negatives -> 0 -> 0.5
        "negative_only": [0.5, 0.5, 0.5, 0.4, 0.0],
        "one_only": [0.6, 0.6, 0.5, 0.5, 0.5],  # positives -> 1 -> 0.6, the rest -> 0 -> 0.5
        "binary": [0.6, 0.6, 0.5, 0.4, 0.4],  # sign
    }
    assert set(expect) == set(ADVANTAGE_MODES)
    for mode, values in expect.items():
        assert optimality_probability(a, 5.0, mode).tolist() == pytest.approx(values), mode
    with pytest.raises(ValueError, match="unknown advantage mode 'both'.*binary"):
        optimality_probability(a, 5.0, "both")


def test_nft_loss_worked_example():
    # x_t = 0.2, t = 0.5, x0 = 0.5, v = 0.4, v_old = 0.2, r = 0.75 (A = 2.5).
    # beta = 1: v+ = v = 0.4 -> x0+ = 0.2 - 0.5 * 0.4 = 0.0, error 0.5: L+ = 0.25 / 0.5 = 0.5;
    #           v- = 2 v_old - v = 0.0 -> x0- = 0.2, error 0.3: L- = 0.09 / 0.3 = 0.3;
    #           loss = 5 (0.75 * 0.5 + 0.25 * 0.3) / 1 = 2.25
    args = one(0.4), one(0.2), one(0.2), one(0.5), torch.tensor([0.5]), torch.tensor([0.75])
    assert nft_loss(*args, beta=1.0).item() == pytest.approx(2.25)
    # beta = 0.1: v+ = 0.04 + 0.18 = 0.22 -> x0+ = 0.09, error 0.41: L+ = 0.41; v- = 0.22 - 0.04 = 0.18 -> x0- = 0.11,
    #             error 0.39: L- = 0.39; loss = 5 (0.75 * 0.41 + 0.25 * 0.39) / 0.1 = 20.25
    assert nft_loss(*args, beta=0.1).item() == pytest.approx(20.25)


def test_nft_loss_over_dimensions_divides_by_the_mean_absolute_error():
    # two dimensions, r = 1 (only L+), beta = 1: x0+ - x0 = x_t - t v - x0 = [0.1, -0.3]: mean sq 0.05, mean abs 0.2
    v, x_t, x0 = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.6, 0.2]]), torch.tensor([[0.5, 0.5]])
    loss = nft_loss(v, v, x_t, x0, torch.tensor([0.5]), torch.tensor([1.0]))
    assert loss.item() == pytest.approx(5 * 0.05 / 0.2)


def test_nft_gradient_pulls_toward_the_positive_and_away_from_the_negative():
    # at v = v_old both implicit policies equal v_old: r = 1 follows the x0 regression, r = 0 goes the other way
    grads = {}
    for r in (1.0, 0.0):
        v = one(0.2).requires_grad_()
        nft_loss(v, one(0.2), one(0.2), one(0.5), torch.tensor([0.5]), torch.tensor([r])).backward()
        grads[r] = v.grad.item()
    # x0 = 0.5 needs x_t - t v = 0.5, i.e. v = -0.6 < 0.2: a positive gradient (descent lowers v) for r = 1
    assert grads[1.0] > 0 and grads[0.0] == pytest.approx(-grads[1.0])
    # d/dv of 5 (x_t - t v - x0)^2 / w, error -0.4, w = 0.4 detached: 5 * 2 * (-0.4) * (-0.5) / 0.4 = 5
    assert grads[1.0] == pytest.approx(5.0)


def test_old_decay_schedules_of_the_code():
    assert [old_decay(s) for s in (0, 1, 100, 499, 500, 10_000)] == pytest.approx([0, 0.001, 0.1, 0.499, 0.5, 0.5])
    ocr = dict(delay=75, rate=0.0075, limit=0.999)
    assert [old_decay(s, **ocr) for s in (0, 74, 75, 76, 175, 1000)] == pytest.approx([0, 0, 0, 0.0075, 0.75, 0.999])
    assert old_decay(123, rate=0.0, limit=0.0) == 0.0  # type 0: the old policy is the current one
