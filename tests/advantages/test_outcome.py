"""Group-relative outcome estimators (grpo, dr_grpo, rloo, opo, gpg, grpo_passk): hand-computed values, masks
with holes, tied rewards, singletons, padded LLM rows, and the group invariants."""

import pytest
import torch

from flowrl import advantages as adv


def column(values):
    return torch.tensor(values, dtype=torch.float32)[:, None]


def ones(b, t=1):
    return torch.ones(b, t, dtype=torch.bool)


def test_grpo_of_1_2_3_4():
    # mean 2.5, population std sqrt(1.25) = 1.1180; (r - 2.5) / (1.1180 + 1e-4)
    out = adv.compute("grpo", column([1, 2, 3, 4]), ones(4), torch.zeros(4).long(), eps=1e-4, ddof=0)
    assert out[:, 0].tolist() == pytest.approx([-1.3415, -0.4472, 0.4472, 1.3415], abs=1e-4)


def test_grpo_std_scope_batch_and_global_use_every_score():
    r, g = column([1, 2, 3, 4, 7]), torch.tensor([0, 0, 0, 0, 1])
    # group means 2.5 (and 7 for the singleton); std of all five scores: mean 3.4, ddof 0 -> 2.0591
    for scope in ("batch", "global"):
        out = adv.grpo(r, ones(5), g, eps=0.0, ddof=0, std_scope=scope, singleton="zero")[:, 0]
        assert out[:4].tolist() == pytest.approx([-1.5 / 2.0591260, -0.5 / 2.0591260, 0.5 / 2.0591260,
                                                  1.5 / 2.0591260], abs=1e-6)
        assert out[4] == 0


def test_clip_and_mask_and_zero_std():
    r, g = column([0, 100, 5, 5]), torch.tensor([0, 0, 1, 1])
    m = torch.tensor([[True], [True], [True], [False]])
    out = adv.grpo(r, m, g, eps=1e-4, ddof=0, std_scope="none", clip=5.0)[:, 0]
    # no std: group 0 -> -50, 50 clipped to +-5; masked row 3 has score 0: group 1 = [5, 0] -> 2.5, (masked) 0
    assert out.tolist() == pytest.approx([-5.0, 5.0, 2.5, 0.0])
    for eps in (1e-4, 0.0):  # tied rewards: zero std gives 0, not NaN, even without eps
        tied = adv.grpo(column([3, 3]), ones(2), torch.zeros(2).long(), eps=eps)
        assert tied.abs().max() == 0


def test_padded_llm_rows_and_holes():
    # right padding: the outcome sits on each row's last valid token; row 1 also has a hole at t=1 whose
    # reward (9) must not count. Scores (masked sums): 1, 2, 4
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 9.0, 2.0, 0.0], [0.0, 0.0, 0.0, 4.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    out = adv.compute("grpo", r, m, torch.zeros(3).long(), eps=0.0, ddof=0)
    # mean 7/3, population std sqrt(((-4/3)^2 + (-1/3)^2 + (5/3)^2) / 3) = sqrt(42/27) = 1.2472
    expected = torch.tensor([-4 / 3, -1 / 3, 5 / 3]) / (42 / 27) ** 0.5
    assert torch.allclose(out, expected[:, None] * m, atol=1e-6)


def test_dr_grpo_has_no_std_and_presets_split_singletons():
    r, g = column([1, 2, 6, 5]), torch.tensor([0, 0, 0, 1])
    # group mean 3: [-2, -1, 3]; the singleton keeps 5 (verl) or gets 0 (TRL)
    assert adv.compute("dr_grpo@verl", r, ones(4), g)[:, 0].tolist() == [-2.0, -1.0, 3.0, 5.0]
    assert adv.compute("dr_grpo@trl", r, ones(4), g)[:, 0].tolist() == [-2.0, -1.0, 3.0, 0.0]


def test_rloo_leaves_one_out():
    r, g = column([1, 2, 6, 5]), torch.tensor([0, 0, 0, 1])
    # row 0: 1 - (2 + 6) / 2 = -3; row 1: 2 - 7/2 = -1.5; row 2: 6 - 3/2 = 4.5
    assert adv.compute("rloo@verl", r, ones(4), g)[:, 0].tolist() == [-3.0, -1.5, 4.5, 5.0]
    assert adv.compute("rloo@trl", r, ones(4), g)[:, 0].tolist() == [-3.0, -1.5, 4.5, 0.0]


def test_opo_weights_the_baseline_by_length():
    # lengths 1, 2, 3 (holes count as missing), scores 3, 6, 1: b = (1*3 + 2*6 + 3*1) / 6 = 3
    r = torch.tensor([[3.0, 0.0, 0.0], [0.0, 7.0, 6.0], [1.0, 0.0, 0.0]])
    m = torch.tensor([[1, 0, 0], [1, 0, 1], [1, 1, 1]], dtype=torch.bool)
    out = adv.opo(r, m, torch.zeros(3).long())
    assert out.tolist() == [[0.0, 0.0, 0.0], [3.0, 0.0, 3.0], [-2.0, -2.0, -2.0]]


def test_gpg_scales_by_the_share_of_nonzero_scores():
    r, g = column([1, 0, 3, 0, 0, 0, 2]), torch.tensor([0, 0, 1, 1, 2, 2, 3])
    # 3 of 7 scores non-zero: alpha = 7/3; means 0.5, 1.5, 0; singleton (raw) keeps its score
    out = adv.gpg(r, ones(7), g)[:, 0]
    a = 7 / 3
    assert out.tolist() == pytest.approx([a * 0.5, -a * 0.5, a * 1.5, -a * 1.5, 0, 0, a * 2], abs=1e-6)


def test_grpo_passk_rewards_only_the_best_row():
    r, g = column([1, 5, 2, 3, 3, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    out = adv.grpo_passk(r, ones(6), g, eps=0.0)[:, 0]
    # group 0: 5 - 2 = 3 over unbiased std of [1, 5, 2] = sqrt(13/3) = 2.0817; group 1: tie 3 - 3 = 0
    assert out.tolist() == pytest.approx([0, 3 / (13 / 3) ** 0.5, 0, 0, 0, 0], abs=1e-6)
    assert adv.grpo_passk(r, ones(6), g, std_scope="none")[:, 0].tolist() == [0, 3, 0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"at least 2 rows per group; groups \[7\]"):
        adv.grpo_passk(column([1, 2, 3]), ones(3), torch.tensor([0, 0, 7]))


@pytest.mark.parametrize("name", ["grpo", "grpo@trl", "grpo@flow_grpo", "dr_grpo", "rloo"])
def test_zero_mean_per_group_and_permutation_equivariance(name):
    gen = torch.Generator().manual_seed(0)
    r, g = torch.rand(12, 3, generator=gen), torch.arange(12) // 4
    m = torch.rand(12, 3, generator=gen) > 0.3
    m[:, 0] = True
    out = adv.compute(name, r, m, g)
    per_row = out.sum(1) / m.sum(1)  # the row's (constant) advantage
    assert torch.allclose(per_row.view(3, 4).sum(1), torch.zeros(3), atol=1e-5)
    perm = torch.randperm(12, generator=gen)
    assert torch.allclose(adv.compute(name, r[perm], m[perm], g[perm]), out[perm], atol=1e-6)
