"""Flash-GRPO's pieces held to Shredded-Pork/Flash-GRPO @8cfc973: the std and coe of sde_step_with_logprob
(flow_grpo/diffusers_patch/wan2_1_pipeline_with_logprob2.py), the step pool and the hard-coded coe table and weight of
scripts/train_wanx2_1_flash.py (value_dict, w = 1 / mean)."""

import numpy as np
import pytest
import torch

from flowrl.sampling.flash import (flash_noise_levels, flash_std, group_steps, one_step_mask, rectification,
                                   rectified_weights)
from flowrl.sampling.steps import flow_grpo_step

# train_wanx2_1_flash.py value_dict: timestep -> coe for the first 10 of Wan 2.1's 20 steps, shift 3
AUTHORS_TABLE = {999: 7.4770, 982: 7.0414, 963: 6.6112, 944: 6.1867, 922: 5.7682, 899: 5.3559, 874: 4.9502,
                 847: 4.5513, 817: 4.1596, 785: 3.7754}


def wan_unipc_sigmas(steps=20, shift=3.0):
    """The grid the table was computed on: linspace(1 - 1/1000, 0, steps + 1) shifted by 3 (the UniPC grid the
    notes name; diffusers 0.42's starts at 1)."""
    s = torch.linspace(0.999, 0.0, steps + 1, dtype=torch.float64)
    return shift * s / (1 + (shift - 1) * s)


def test_rectification_reproduces_the_authors_table():
    sigmas = wan_unipc_sigmas()
    timesteps = (sigmas[:10] * 1000).long().tolist()
    assert timesteps == list(AUTHORS_TABLE)
    coe = rectification(sigmas)[:10]
    torch.testing.assert_close(coe, torch.tensor(list(AUTHORS_TABLE.values()), dtype=torch.float64), atol=5e-5,
                               rtol=0)


def test_flow_grpo_step_with_flash_levels_is_the_authors_step():
    # their mean: x (1 + std^2 dt / (2 sigma)) + v (1 + std^2 (1 - sigma) / (2 sigma)) dt, step std std sqrt(-dt)
    sigmas = torch.tensor([1.0, 0.9, 0.7, 0.4, 0.0])
    levels, std = flash_noise_levels(sigmas), flash_std(sigmas)
    gen = torch.Generator().manual_seed(0)
    z, v, noise = (torch.randn(2, 3, generator=gen) for _ in range(3))
    for k in range(4):
        sigma, dt = sigmas[k], sigmas[k + 1] - sigmas[k]
        out = flow_grpo_step(z, v, sigma, sigmas[k + 1], noise, noise_level=levels[k])
        mean = z * (1 + std[k] ** 2 / (2 * sigma) * dt) + v * (1 + std[k] ** 2 * (1 - sigma) / (2 * sigma)) * dt
        torch.testing.assert_close(out.mean, mean)
        torch.testing.assert_close(out.std.flatten(), (std[k] * torch.sqrt(-dt)).expand(2))


def test_step_pool_draw_is_per_group_and_covers_the_pool():
    # the authors: random.choices(range(10), weights=[1] * 10) once per prompt
    groups = torch.arange(400).repeat_interleave(3)
    steps = group_steps(groups, list(range(10)), seed=1, iteration=3)
    per_group = steps.view(400, 3)
    assert (per_group == per_group[:, :1]).all() and set(per_group[:, 0].tolist()) == set(range(10))
    again = group_steps(groups.flip(0), list(range(10)), seed=1, iteration=3).flip(0)  # order-free
    assert torch.equal(steps, again)
    assert not torch.equal(steps, group_steps(groups, list(range(10)), seed=1, iteration=4))
    mask = one_step_mask(steps, 20)
    assert mask.sum(1).eq(1).all() and torch.equal(mask.float().argmax(1), steps)


def test_weights_over_the_batch_and_over_the_pool():
    coe = rectification(wan_unipc_sigmas()).float()
    steps = torch.tensor([0, 0, 9, 9])
    # the authors: value / mean over the micro-batch = 7.4770 / ((7.4770 + 3.7754) / 2)
    torch.testing.assert_close(rectified_weights(steps, coe)[0], torch.tensor(7.4770 / 5.6262), atol=1e-4, rtol=0)
    assert rectified_weights(steps, coe).mean().item() == pytest.approx(1.0)
    pool = list(range(10))
    expected = coe[steps] / float(np.mean(list(AUTHORS_TABLE.values())))
    torch.testing.assert_close(rectified_weights(steps, coe, "pool", pool=pool), expected, atol=1e-4, rtol=0)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="choose one of"):
        rectified_weights(torch.tensor([0]), torch.ones(2), "group")
    with pytest.raises(ValueError, match="needs the candidate steps"):
        rectified_weights(torch.tensor([0]), torch.ones(2), "pool")
    with pytest.raises(ValueError, match="pool is empty"):
        group_steps(torch.tensor([0]), [], seed=0, iteration=0)
