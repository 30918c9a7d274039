"""flowrl against independent re-implementations of verl's estimators, written as literal per-group Python loops
after volcengine/verl ``verl/trainer/ppo/core_algos.py`` and ``verl/utils/torch_functional.py`` (float32, as verl
runs them), on random batches with uneven groups, a singleton group, right padding and holes.

verl leaves whitened values at masked positions (GAE); flowrl zeroes them, so comparisons are on valid positions.
"""

from collections import defaultdict

import pytest
import torch

from flowrl import advantages as adv

B, T = 13, 7


def batch(seed: int, holes: bool = False):
    """rewards [B, T] (dense rewards plus an outcome on the last valid token, 0 at padding), mask, group ids."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if holes:
        mask &= (torch.rand(B, T, generator=gen) > 0.25) | (torch.arange(T)[None, :] == lengths[:, None] - 1)
    rewards = 0.3 * torch.randn(B, T, generator=gen)
    rewards[torch.arange(B), lengths - 1] += torch.randint(0, 2, (B,), generator=gen).float()
    rewards = rewards * mask
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 3])  # sizes 4, 3, 5 and a singleton
    values = torch.randn(B, T, generator=gen)
    return rewards, mask, group_ids, values, gen


# -- verl, loop by loop -------------------------------------------------------------------------------------------

def verl_masked_mean(x, m):
    return (x * m).sum() / (m.sum() + 1e-8)


def verl_masked_whiten(x, m):
    mean = verl_masked_mean(x, m)
    var = verl_masked_mean((x - mean) ** 2, m) * (m.sum() / (m.sum() - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8)


def verl_grpo(rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    scores = rewards.sum(dim=-1)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(len(scores)):
        id2score[int(index[i])].append(scores[i])
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(group)), torch.std(torch.stack(group))
    for i in range(len(scores)):
        g = int(index[i])
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[g]) / (id2std[g] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[g]
    return scores.unsqueeze(-1) * mask


def verl_group_means(scores, index):
    """verl's id2score / id2mean dictionaries (a singleton's mean is 0)."""
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[int(index[i])].append(scores[i])
    return id2score, {k: torch.tensor(0.0) if len(v) == 1 else torch.mean(torch.stack(v)) for k, v in id2score.items()}


def verl_rloo(rewards, mask, index):
    scores = rewards.sum(dim=-1)
    id2score, id2mean = verl_group_means(scores, index)
    for i in range(len(scores)):
        n = len(id2score[int(index[i])])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[int(index[i])] * n / (n - 1)
    return scores.unsqueeze(-1) * mask


def verl_opo(rewards, mask, index):
    length, scores = mask.sum(dim=-1), rewards.sum(dim=-1)
    id2score, id2len, id2bsl = defaultdict(list), defaultdict(list), {}
    for i in range(len(scores)):
        id2score[int(index[i])].append(scores[i])
        id2len[int(index[i])].append(length[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2bsl[idx] = torch.tensor(0.0)
        else:
            s, n = torch.stack(id2score[idx]), torch.stack(id2len[idx])
            id2bsl[idx] = (n * s).sum() / n.sum()
    for i in range(len(scores)):
        scores[i] = scores[i] - id2bsl[int(index[i])]
    return scores.unsqueeze(-1) * mask


def verl_gpg(rewards, mask, index):
    scores = rewards.sum(dim=-1)
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    id2score, id2mean = verl_group_means(scores, index)
    for i in range(len(scores)):
        scores[i] = alpha * (scores[i] - id2mean[int(index[i])]) / 1.0
    return scores.unsqueeze(-1) * mask


def verl_grpo_passk(rewards, mask, index, epsilon=1e-6):
    scores = rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    id2scores, id2indices = defaultdict(list), defaultdict(list)
    for i in range(len(scores)):
        id2scores[int(index[i])].append(scores[i])
        id2indices[int(index[i])].append(i)
    for idx in id2scores:
        group = torch.stack(id2scores[idx])
        top, top_idx = torch.topk(group, 2)
        advantages[id2indices[idx][top_idx[0].item()]] = (top[0] - top[1]) / (torch.std(group) + epsilon)
    return advantages.unsqueeze(-1) * mask


def verl_rf_pp_baseline(rewards, mask, index):
    scores = rewards.sum(dim=-1)
    id2score, id2mean = verl_group_means(scores, index)
    for i in range(len(scores)):
        scores[i] = scores[i] - id2mean[int(index[i])]
    scores = scores.unsqueeze(-1).tile([1, rewards.shape[1]]) * mask
    return verl_masked_whiten(scores, mask) * mask


def verl_rf_pp(rewards, mask, gamma):
    returns, running = torch.zeros_like(rewards), 0
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return verl_masked_whiten(returns, mask) * mask


def verl_remax(rewards, baselines, mask):
    returns = (rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    return returns - baselines.unsqueeze(-1) * mask


def verl_gae(rewards, values, mask, gamma, lam):
    nextvalues, lastgaelam, reversed_adv = 0, 0, []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        reversed_adv.append(lastgaelam)
    return verl_masked_whiten(torch.stack(reversed_adv[::-1], dim=1), mask)


# -- comparisons ---------------------------------------------------------------------------------------------------

def assert_close_on_mask(ours, theirs, mask):
    assert torch.allclose(ours[mask], theirs[mask].float(), rtol=1e-5, atol=1e-5)
    assert (ours[~mask] == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name, oracle", [
    ("grpo@verl", verl_grpo),
    ("dr_grpo@verl", lambda r, m, g: verl_grpo(r, m, g, norm_adv_by_std_in_grpo=False)),
    ("rloo@verl", verl_rloo), ("opo", verl_opo), ("gpg", verl_gpg),
    ("reinforce_plus_plus_baseline", verl_rf_pp_baseline),
])
def test_group_estimators_match_verl(name, oracle, seed):
    rewards, mask, group_ids, _, _ = batch(seed, holes=seed == 2)
    mf = mask.float()
    assert_close_on_mask(adv.compute(name, rewards, mask, group_ids), oracle(rewards.clone(), mf, group_ids), mask)


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_passk_matches_verl(seed):
    rewards, mask, group_ids, _, _ = batch(seed)
    keep = group_ids != 3  # verl raises on the singleton, as flowrl does
    rewards, mask, group_ids = rewards[keep], mask[keep], group_ids[keep]
    assert_close_on_mask(adv.compute("grpo_passk", rewards, mask, group_ids),
                  verl_grpo_passk(rewards.clone(), mask.float(), group_ids), mask)


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8), (0.5, 0.0)])
def test_return_estimators_match_verl(gamma, lam, holes):
    rewards, mask, group_ids, values, gen = batch(3, holes=holes)
    mf = mask.float()
    assert_close_on_mask(adv.compute("gae", rewards, mask, group_ids, values=values, gamma=gamma, lam=lam),
                  verl_gae(rewards, values, mf, gamma, lam), mask)
    assert_close_on_mask(adv.compute("reinforce_plus_plus", rewards, mask, group_ids, gamma=gamma),
                  verl_rf_pp(rewards, mf, gamma), mask)
    baselines = torch.randn(B, generator=gen)
    assert_close_on_mask(adv.compute("remax", rewards, mask, group_ids, baselines=baselines),
                  verl_remax(rewards, baselines, mf), mask)
