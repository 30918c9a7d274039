"""Return-based estimators (gae, reinforce_plus_plus, reinforce_plus_plus_baseline, remax): hand-computed values on
right-padded LLM-style rows (outcome on the last valid token) and on rows with holes."""

import pytest
import torch

from flowrl import advantages as adv

# row 0: 3 valid tokens, outcome 1; row 1: 2 valid tokens (right padding), a dense reward 2 on its last token
R = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
M = torch.tensor([[True, True, True], [True, True, False]])
G = torch.zeros(2).long()


def valid(x):
    return pytest.approx(x[M].tolist(), abs=1e-5)


def test_gae_whitens_over_valid_tokens():
    v = torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 7.0]])
    out = adv.gae(R, M, G, values=v)  # gamma = lam = 1: A_t = sum of rewards from t - V_t
    # A = [.5 .5 .5 | 1 1]; mean .7; unbiased var (3 * .04 + 2 * .09) / 4 = .075
    s = (0.075 + 1e-8) ** -0.5
    assert out[M].tolist() == valid(torch.tensor([[-0.2 * s] * 3, [0.3 * s, 0.3 * s, 0.0]]))
    assert out[1, 2] == 0


def test_reinforce_plus_plus_discounts_then_whitens():
    out = adv.reinforce_plus_plus(R, M, G, gamma=0.5, eps=0.0)
    # G = [.25 .5 1 | 1 2]; mean .95; squares .49 .2025 .0025 .0025 1.1025 -> var 1.8 / 4 = .45
    s = 0.45 ** -0.5
    expected = torch.tensor([[-0.7 * s, -0.45 * s, 0.05 * s], [0.05 * s, 1.05 * s, 0.0]])
    assert out[M].tolist() == valid(expected)


def test_reinforce_plus_plus_resets_at_holes():
    r, m = torch.tensor([[2.0, 9.0, 1.0], [0.0, 0.0, 3.0]]), torch.tensor([[True, False, True], [True, True, True]])
    # row 0: G2 = 1, the hole cuts the return: G0 = 2; row 1: G = [3, 3, 3] (gamma 1)
    # entries [2, 1 | 3, 3, 3]: mean 2.4, squares .16 1.96 .36 .36 .36 -> var 3.2 / 4 = .8
    out = adv.reinforce_plus_plus(r, m, torch.zeros(2).long(), eps=0.0)
    s = 0.8 ** -0.5
    assert out.tolist() == [pytest.approx(v, abs=1e-5) for v in [[-0.4 * s, 0.0, -1.4 * s], [0.6 * s] * 3]]


def test_reinforce_plus_plus_baseline_centres_then_whitens():
    out = adv.reinforce_plus_plus_baseline(R, M, G, eps=0.0)
    # scores 1, 2 -> centred -.5, .5 on 3 and 2 tokens; mean -.1; var (3 * .16 + 2 * .36) / 4 = .3
    s = 0.3 ** -0.5
    assert out[M].tolist() == valid(torch.tensor([[-0.4 * s] * 3, [0.6 * s, 0.6 * s, 0.0]]))


def test_remax_subtracts_the_greedy_baseline_from_returns():
    out = adv.remax(R, M, G, baselines=torch.tensor([0.25, 3.0]))
    # returns-to-go [1 1 1 | 2 2] minus baselines .25 and 3
    assert out.tolist() == [[0.75, 0.75, 0.75], [-1.0, -1.0, 0.0]]
    holes = adv.remax(torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[True, False, True]]), torch.zeros(1).long(),
                      baselines=torch.zeros(1))
    assert holes.tolist() == [[3.0, 0.0, 2.0]]  # the masked 5 is not summed (verl's masked cumsum)
