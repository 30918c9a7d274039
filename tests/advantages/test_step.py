"""Step-level estimators (step_grpo, gigpo, stratified_grpo, prime): hand-computed values, the DenseGRPO worked
example, and reduction to the outcome estimator when the steps carry no extra information."""

import pytest
import torch

from flowrl import advantages as adv


def ones(b, t):
    return torch.ones(b, t, dtype=torch.bool)


def random_batch(seed, b=12, t=4, group=4):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.zeros(b, t)
    rewards[:, -1] = torch.randn(b, generator=gen)  # outcome-only, on the last step
    return rewards, ones(b, t), torch.arange(b) // group, gen


def test_step_grpo_reproduces_the_dense_grpo_worked_example():
    # issue 5: G = 3, T = 3, step rewards dR; normalised per step across the group (ddof 0, eps 0).
    # step 0: [.10 -.05 .05], mean .0333, std sqrt(.011667 / 3) = .06236 -> [1.0690 -1.3363 .2673]
    dr = torch.tensor([[0.10, 0.05, 0.15], [-0.05, 0.25, -0.10], [0.05, -0.05, 0.05]])
    out = adv.compute("step_grpo", dr, ones(3, 3), torch.zeros(3).long(), ddof=0, eps=0.0)
    expected = torch.tensor([[1.0690, -1.3363, 0.2673], [-0.2673, 1.3363, -1.0690], [1.1355, -1.2978, 0.1622]])
    assert torch.allclose(out.T, expected, atol=1e-4)


def test_step_grpo_leaves_holes_out_of_the_step_statistics():
    r = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 99.0]])
    m = torch.tensor([[True, True], [True, True], [True, False]])
    out = adv.step_grpo(r, m, torch.zeros(3).long(), eps=0.0, ddof=0)
    # step 0: [1 3 5], mean 3, std sqrt(8/3); step 1: only [2 4] -> [-1 1]; the hole gets 0
    s = (8 / 3) ** -0.5
    assert out.tolist() == [pytest.approx(v, abs=1e-6) for v in [[-2 * s, -1.0], [0.0, 1.0], [2 * s, 0.0]]]


def test_step_grpo_batch_scope_pools_groups_per_step():
    r = torch.tensor([[0.0, 0.0], [2.0, 10.0], [4.0, 0.0], [6.0, 30.0]])
    g = torch.tensor([0, 0, 1, 1])
    # means per (group, step): step 0: 1, 5; step 1: 5, 15 -> centred [-1 1 -1 1], [-5 5 -15 15]
    # batch: step 0 std over [0 2 4 6] = sqrt(5); step 1 over [0 10 0 30] = sqrt(150)
    batch = adv.step_grpo(r, ones(4, 2), g, eps=0.0, ddof=0, std_scope="batch")
    assert batch[:, 0].tolist() == pytest.approx([-(5 ** -0.5), 5 ** -0.5, -(5 ** -0.5), 5 ** -0.5], abs=1e-6)
    assert batch[:, 1].tolist() == pytest.approx([v / 150 ** 0.5 for v in (-5, 5, -15, 15)], abs=1e-6)
    # global: one std over all eight entries: mean 6.5, variance 718 / 8 = 89.75
    glob = adv.step_grpo(r, ones(4, 2), g, eps=0.0, ddof=0, std_scope="global")
    assert glob[:, 1].tolist() == pytest.approx([v / 89.75 ** 0.5 for v in (-5, 5, -15, 15)], abs=1e-6)


def test_step_grpo_reduces_to_grpo_without_step_information():
    rewards, mask, g, gen = random_batch(0)
    grpo = adv.compute("grpo", rewards, mask, g, eps=0.0)
    # outcome-only rewards accumulated into returns-to-go: every step sees the row's score
    assert torch.allclose(adv.compute("step_grpo", rewards, mask, g, eps=0.0, gamma=1.0), grpo, atol=1e-6)
    # the same reward on every step of a row: per-step normalisation of c_i is GRPO of T * c_i (scale-free)
    flat = torch.randn(12, 1, generator=gen).expand(12, 4)
    assert torch.allclose(adv.step_grpo(flat, mask, g, eps=0.0), adv.grpo(flat, mask, g, eps=0.0), atol=1e-5)


def test_gigpo_adds_the_weighted_step_group_advantage():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]])  # scores 1, 0, 2
    ids = torch.tensor([[5, 7], [5, 8], [6, 9]])  # rows 0 and 1 share the state at step 0; the rest alone
    out = adv.gigpo(r, ones(3, 2), torch.zeros(3).long(), step_group_ids=ids, eps=0.0, ddof=0, weight=0.5)
    # episode: mean 1, std sqrt(2/3) -> [0, -1.2247, 1.2247]; step group {0, 1} at t=0: returns [1, 0] -> [1, -1]
    e = 1.5 ** 0.5
    assert out.tolist() == [pytest.approx(v, abs=1e-5) for v in [[0.5, 0.0], [-e - 0.5, -e], [e, e]]]
    mean_norm = adv.gigpo(r, ones(3, 2), torch.zeros(3).long(), step_group_ids=ids, std_scope="none")
    # verl-agent's mode="mean_norm": [0 -1 1] + [.5 -.5 0] at t=0
    assert mean_norm.tolist() == [[0.5, 0.0], [-1.5, -1.0], [1.0, 1.0]]


def test_gigpo_reduces_to_grpo_when_every_step_group_is_a_singleton():
    rewards, mask, g, gen = random_batch(1)
    rewards += 0.1 * torch.randn(rewards.shape, generator=gen)  # dense rewards too
    singletons = torch.arange(48).view(12, 4)
    for ids in (singletons, torch.full((12, 4), -1)):
        out = adv.compute("gigpo", rewards, mask, g, step_group_ids=ids)
        assert torch.allclose(out, adv.compute("grpo", rewards, mask, g), atol=1e-6)


def test_stratified_grpo_blends_stratum_and_group_normalisation():
    r, g = torch.tensor([[1.0], [3.0], [10.0], [14.0]]), torch.zeros(4).long()
    strata = torch.tensor([0, 0, 1, 1])
    out = adv.stratified_grpo(r, ones(4, 1), g, stratum_ids=strata, eps=0.0, alpha=0.5)[:, 0]
    # SAN: +-1/sqrt(2) within each stratum; GN: mean 7, unbiased var 110/3 -> [-6 -4 3 7] / 6.0553
    san, gn = [-(0.5 ** 0.5), 0.5 ** 0.5] * 2, [v / (110 / 3) ** 0.5 for v in (-6, -4, 3, 7)]
    assert out.tolist() == pytest.approx([0.5 * a + 0.5 * b for a, b in zip(san, gn)], abs=1e-6)
    rewards, mask, g, _ = random_batch(2)
    grpo = adv.grpo(rewards, mask, g)
    one_stratum = adv.stratified_grpo(rewards, mask, g, stratum_ids=torch.zeros(12).long())
    assert torch.allclose(one_stratum, grpo, atol=1e-6)
    assert torch.allclose(adv.stratified_grpo(rewards, mask, g, stratum_ids=torch.arange(12) % 2, alpha=0.0), grpo,
                          atol=1e-6)


def test_prime_adds_the_normalised_process_advantage():
    r = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    p = torch.tensor([[0.1, 0.3], [0.5, 0.7]])
    # episode: [-1 1]; process pooled over the group: mean .4, std sqrt(.05) -> [-1.3416 -.4472 .4472 1.3416]
    a, b = 0.3 / 0.05 ** 0.5, 0.1 / 0.05 ** 0.5
    out = adv.prime(r, ones(2, 2), torch.zeros(2).long(), process_rewards=p, eps=0.0, ddof=0, alpha=0.5)
    assert out.tolist() == [pytest.approx(v, abs=1e-5) for v in [[-1 - a / 2, -1 - b / 2], [1 + b / 2, 1 + a / 2]]]
    togo = adv.prime(r, ones(2, 2), torch.zeros(2).long(), process_rewards=p, eps=0.0, ddof=0, gamma=1.0)
    # returns-to-go of the process advantages: row 0 [-a - b, -b], row 1 [a + b, a]
    assert togo.tolist() == [pytest.approx(v, abs=1e-5) for v in [[-1 - a - b, -1 - b], [1 + a + b, 1 + a]]]
    rewards, mask, g, _ = random_batch(3)
    silent = adv.prime(rewards, mask, g, process_rewards=torch.zeros(12, 4))
    assert torch.allclose(silent, adv.grpo(rewards, mask, g), atol=1e-6)


@pytest.mark.parametrize("name", ["step_grpo", "gigpo", "stratified_grpo", "prime"])
def test_permuting_rows_within_groups_permutes_the_advantages(name):
    gen = torch.Generator().manual_seed(4)
    r, g = torch.randn(12, 4, generator=gen), torch.arange(12) // 4
    m = torch.rand(12, 4, generator=gen) > 0.2
    extra = dict(step_group_ids=torch.randint(0, 3, (12, 4), generator=gen), stratum_ids=torch.arange(12) % 2,
                 process_rewards=torch.randn(12, 4, generator=gen))
    perm = torch.cat([torch.randperm(4, generator=gen) + 4 * k for k in range(3)])
    out = adv.compute(name, r, m, g, **extra)
    permuted = {k: v[perm] for k, v in extra.items()}
    assert torch.allclose(adv.compute(name, r[perm], m[perm], g[perm], **permuted), out[perm], atol=1e-6)
