"""The sampler: seeded noise per sample, recorded states and log-probs, trained-step masks, continuing from any
state with per-row step kinds, and branch noise from (tree seed, path)."""

import pytest
import torch

from flowrl.sampling.sampler import (NoiseStream, branch_seed, path_noise, sample, sample_from, sde_steps, seeded_noise,
                                     trained_steps)
from flowrl.sampling.steps import flow_grpo_step


def linear_velocity(z, sigma, rows=None):
    return -z + sigma.view(-1, 1, 1, 1)


def test_sample_records_each_state_and_log_prob():
    sigmas = torch.linspace(1, 0, 5)
    seeds = torch.tensor([3, 4])
    latents, log_probs = sample(linear_velocity, seeds, sigmas, (1, 2, 2), "flow_grpo", 0.7)
    noise = seeded_noise(seeds, (1, 2, 2), 5)
    assert latents.shape == (2, 5, 1, 2, 2) and log_probs.shape == (2, 4)
    assert torch.equal(latents[:, 0], noise[:, 0])
    # step 1 by hand from the recorded state
    z = latents[:, 1]
    expected = flow_grpo_step(z, linear_velocity(z, sigmas[1].expand(2)), sigmas[1], sigmas[2],
                              noise=noise[:, 2], noise_level=0.7)
    assert torch.allclose(latents[:, 2], expected.z_next) and torch.allclose(log_probs[:, 1], expected.log_prob)


def test_a_trajectory_depends_on_its_seed_only():
    sigmas = torch.linspace(1, 0, 4)
    pair, _ = sample(linear_velocity, torch.tensor([11, 12]), sigmas, (1, 2, 2))
    alone, _ = sample(linear_velocity, torch.tensor([12]), sigmas, (1, 2, 2))
    assert torch.equal(pair[1], alone[0])


def test_ode_window_has_zero_log_prob_outside_the_sde_steps():
    sigmas = torch.linspace(1, 0, 5)
    mask = sde_steps(4, "flow_grpo", (1, 3))
    _, log_probs = sample(linear_velocity, torch.tensor([0]), sigmas, (1, 2, 2), "flow_grpo", 0.7, mask)
    assert mask.tolist() == [False, True, True, False]
    assert log_probs[0, 0] == 0 and log_probs[0, 3] == 0 and (log_probs[0, 1:3] != 0).all()


def test_trained_steps_follow_timestep_fraction_and_skip_cps_landing():
    sigmas = torch.linspace(1, 0, 11)
    assert trained_steps(sde_steps(10, "flow_grpo"), 0.5, sigmas, "flow_grpo").nonzero().flatten().tolist() == [
        0, 1, 2, 3, 4]
    assert trained_steps(sde_steps(10, "cps"), 1.0, sigmas, "cps").tolist() == [True] * 9 + [False]


def test_sample_from_continues_a_trajectory_bit_for_bit():
    sigmas = torch.linspace(1, 0, 7)
    seeds = torch.tensor([5, 6])
    whole, whole_lp = sample(linear_velocity, seeds, sigmas, (1, 2, 2), "flow_grpo", 0.7)
    noise = seeded_noise(seeds, (1, 2, 2), 7)
    # stop after 3 steps, then continue from the recorded state with the rest of each row's noise
    head, head_lp = sample_from(linear_velocity, noise[:, 0], sigmas, 0, noise[:, 1:4], "flow_grpo", None, 0.7)
    tail, tail_lp = sample_from(linear_velocity, head[:, -1], sigmas, 3, noise[:, 4:], "flow_grpo", None, 0.7)
    assert torch.equal(torch.cat([head, tail[:, 1:]], 1), whole)
    assert torch.equal(torch.cat([head_lp, tail_lp], 1), whole_lp)


def test_per_row_step_kinds_match_each_row_sampled_alone():
    sigmas = torch.linspace(1, 0, 5)
    seeds = torch.tensor([1, 2, 3])
    kinds = torch.tensor([[True, True, False, False], [False, False, False, False], [True, False, True, False]])
    latents, log_probs = sample(linear_velocity, seeds, sigmas, (1, 2, 2), "cps", 0.7, kinds)
    for row in range(3):
        alone, alone_lp = sample(linear_velocity, seeds[row:row + 1], sigmas, (1, 2, 2), "cps", 0.7, kinds[row])
        assert torch.equal(latents[row], alone[0]) and torch.equal(log_probs[row], alone_lp[0])
    assert torch.equal(log_probs != 0, kinds)  # ODE steps carry no log-prob


def test_branch_noise_depends_on_the_tree_seed_and_the_path_only():
    first = path_noise(torch.tensor([9, 9, 9]), [[0], [1], [0, 1]], (3,), 2)
    again = path_noise(torch.tensor([9, 4]), [[0, 1], [2]], (3,), 2)
    assert torch.equal(first[2], again[0])  # the same node, whatever the batch around it
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])
    assert branch_seed(9, [0, 1]) != branch_seed(9, [1, 0]) and branch_seed(9, []) == 9


@pytest.mark.parametrize("shape", [(3, 4, 4), (1, 2, 2), (3, 5, 7)])  # numel % 16 == 0: drawn per step; else at once
def test_sample_draws_step_by_step_exactly_the_noise_drawn_up_front(shape):
    sigmas, seeds = torch.linspace(1, 0, 6), torch.tensor([21, 5, 8])
    noise = seeded_noise(seeds, shape, 6)
    expected = sample_from(linear_velocity, noise[:, 0], sigmas, 0, noise[:, 1:], "flow_grpo", noise_level=0.7)
    for got, want in zip(sample(linear_velocity, seeds, sigmas, shape, "flow_grpo", 0.7), expected):
        assert torch.equal(got, want)
    stream = NoiseStream(seeds, shape, 6)
    assert stream.shape == (3, 6, *shape) and torch.equal(stream.draw(0), noise[:, 0])
    assert stream.rest().shape == (3, 5, *shape)
    with pytest.raises(IndexError, match="draw 3 asked for; draw 1 of 6 is next"):
        stream.draw(2)  # a stream hands its draws out in order, once each
