"""GRPO advantages: hand-computed values, presets, singletons, masks, invariants."""

import pytest
import torch

from flowrl import advantages as adv


def column(values):
    return torch.tensor(values, dtype=torch.float32)[:, None]


def test_group_advantages_of_1_2_3_4():
    # mean 2.5, population std sqrt(1.25) = 1.1180; (r - 2.5) / (1.1180 + 1e-4)
    out = adv.compute("grpo", column([1, 2, 3, 4]), torch.ones(4, 1, dtype=torch.bool), torch.zeros(4).long(),
                      eps=1e-4, ddof=0)
    assert out[:, 0].tolist() == pytest.approx([-1.3415, -0.4472, 0.4472, 1.3415], abs=1e-4)


def test_presets_differ_exactly_where_the_peers_differ():
    r, m, g = column([1, 2, 3, 4, 7]), torch.ones(5, 1, dtype=torch.bool), torch.tensor([0, 0, 0, 0, 1])
    verl = adv.compute("grpo@verl", r, m, g)[:, 0]
    trl = adv.compute("grpo@trl", r, m, g)[:, 0]
    fg = adv.compute("grpo@flow_grpo", r, m, g)[:, 0]
    # unbiased std of [1,2,3,4] = 1.2910; verl: (1 - 2.5) / (1.2910 + 1e-6)
    assert verl[0].item() == pytest.approx(-1.5 / 1.2909944, abs=1e-5)
    assert trl[0].item() == pytest.approx(-1.5 / (1.2909944 + 1e-4), abs=1e-5)
    assert verl[4].item() == pytest.approx(7.0) and trl[4].item() == 0 and fg[4].item() == 0  # singleton
    # flow_grpo: population std of all five scores (mean 3.4, std 2.0591)
    assert fg[0].item() == pytest.approx((1 - 2.5) / (2.0591260 + 1e-4), abs=1e-5)


def test_clip_and_mask_and_zero_std():
    r, g = column([0, 100, 5, 5]), torch.tensor([0, 0, 1, 1])
    m = torch.tensor([[True], [True], [True], [False]])
    out = adv.grpo(r, m, g, eps=1e-4, ddof=0, std_scope="none", clip=5.0)[:, 0]
    # Dr.GRPO (no std): group 0 -> -50, 50 clipped to +-5; masked row 3 has score 0: group 1 = [5, 0]
    assert out.tolist() == pytest.approx([-5.0, 5.0, 2.5, 0.0])
    tied = adv.grpo(column([3, 3]), torch.ones(2, 1, dtype=torch.bool), torch.zeros(2).long(), eps=1e-4)
    assert tied.abs().max() == 0


def test_zero_mean_per_group_and_permutation_equivariance():
    gen = torch.Generator().manual_seed(0)
    r, m = torch.rand(12, 1, generator=gen), torch.ones(12, 1, dtype=torch.bool)
    g = torch.arange(12) // 4
    out = adv.compute("grpo@trl", r, m, g)[:, 0]
    assert torch.allclose(out.view(3, 4).sum(1), torch.zeros(3), atol=1e-5)
    perm = torch.randperm(12, generator=gen)
    assert torch.allclose(adv.compute("grpo@trl", r[perm], m, g[perm])[:, 0], out[perm], atol=1e-6)


def test_dense_rows_broadcast_over_the_mask():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    m = torch.tensor([[True, True, False], [True, True, True]])
    out = adv.compute("grpo", r, m, torch.zeros(2).long(), ddof=0, eps=0.0)
    # row 0's masked outcome does not count: scores [0, 3] -> [-1, 1]
    assert out.tolist() == [[-1.0, -1.0, 0.0], [1.0, 1.0, 1.0]]


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown advantage estimator 'grp'"):
        adv.compute("grp", column([1]), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1).long())
    with pytest.raises(ValueError, match="NaN or inf"):
        adv.grpo(column([1, float("nan")]), torch.ones(2, 1, dtype=torch.bool), torch.zeros(2).long())
    assert {"grpo", "grpo@verl", "grpo@trl", "grpo@flow_grpo"} <= set(adv.available())
