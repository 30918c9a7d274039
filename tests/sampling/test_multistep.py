"""MixGRPO-Flash's solver after the window (sampling/multistep.py, policies/multistep_solvers.py): on the steps after
the window the rollout is diffusers' DPM-Solver++ on the same grid, its second-order step is the formula of the
authors' ``multistep_dpm_solver_second_order_update`` (``Tencent-Hunyuan/MixGRPO`` ``fastvideo/utils/
sampling_utils.py``, dpmsolver++, midpoint), and the window (its states and log-probs) is unchanged."""

import pytest
import torch

from flowrl.policies.multistep_solvers import multistep_solver
from flowrl.sampling.multistep import MultistepTail
from flowrl.sampling.sampler import sample, sample_from
from flowrl.sampling.solver import solver_sample

SHAPE = (2, 4, 4)  # 32 values: NoiseStream's draws are seeded_noise's
SEEDS = torch.tensor([5, 6])


def velocity(z, sigma, rows):
    """A smooth stand-in model: each row's own field, non-linear in z, varying with sigma."""
    return torch.tanh(z) * (1 + sigma.view(-1, 1, 1, 1)) - 0.3 * (rows.view(-1, 1, 1, 1) + 1)


def grid(num_steps=6):
    """diffusers' own flow grid of the solver (shift 3), so that its independent runs step on the same one."""
    scheduler = multistep_solver("dpmsolver++")
    scheduler.register_to_config(flow_shift=3.0)
    scheduler.set_timesteps(num_steps)
    return scheduler.sigmas.clone()


def test_a_tail_from_step_zero_is_diffusers_solver_on_the_grid():
    sigmas = grid()
    ode = torch.zeros(6, dtype=torch.bool)
    latents, _ = sample(velocity, SEEDS, sigmas, SHAPE, "flow_grpo", sde_mask=ode,
                        tail=MultistepTail(multistep_solver("dpmsolver++"), sigmas, 0))
    scheduler = multistep_solver("dpmsolver++")
    scheduler.register_to_config(flow_shift=3.0)
    expected = solver_sample(velocity, SEEDS, sigmas, SHAPE, scheduler)  # diffusers' loop, its own sigmas
    torch.testing.assert_close(latents[:, -1], expected, rtol=1e-5, atol=1e-6)
    euler, _ = sample(velocity, SEEDS, sigmas, SHAPE, "flow_grpo", sde_mask=ode)
    assert (euler[:, -1] - expected).abs().max() > 1e-3  # a different integrator, not Euler again


def test_after_the_window_the_solver_steps_and_the_window_is_unchanged():
    sigmas, window = grid(), torch.tensor([False, True, True, False, False, False])
    plain, plain_log_probs = sample(velocity, SEEDS, sigmas, SHAPE, "flow_grpo", 0.7, window)
    latents, log_probs = sample(velocity, SEEDS, sigmas, SHAPE, "flow_grpo", 0.7, window,
                                tail=MultistepTail(multistep_solver("dpmsolver++"), sigmas, 3))
    assert torch.equal(latents[:, :4], plain[:, :4]) and torch.equal(log_probs, plain_log_probs)
    assert log_probs[:, 1:3].abs().sum() > 0 and log_probs[:, 3:].abs().sum() == 0
    # step 3 by hand, DPM-Solver++ (2M, midpoint) on alpha = 1 - sigma with data predictions x - sigma v of steps 2, 3
    lam = lambda s: torch.log(1 - s) - torch.log(s)  # noqa: E731
    s0, s1, t = sigmas[3], sigmas[2], sigmas[4]
    h, h0 = lam(t) - lam(s0), lam(s0) - lam(s1)
    m0 = latents[:, 3] - s0 * velocity(latents[:, 3], s0.expand(2), torch.arange(2))
    m1 = latents[:, 2] - s1 * velocity(latents[:, 2], s1.expand(2), torch.arange(2))
    d1 = (m0 - m1) * h / h0
    by_hand = t / s0 * latents[:, 3] - (1 - t) * (torch.exp(-h) - 1) * (m0 + 0.5 * d1)
    torch.testing.assert_close(latents[:, 4], by_hand, rtol=1e-5, atol=1e-6)
    # the rest: diffusers' solver on its own grid (the same), fed the same model outputs, stepping on after the window
    scheduler = multistep_solver("dpmsolver++")
    scheduler.register_to_config(flow_shift=3.0)
    scheduler.set_timesteps(6)
    assert torch.equal(scheduler.sigmas, sigmas)
    z = latents[:, 0]
    for k in range(6):
        v = velocity(z, sigmas[k].expand(2), torch.arange(2))
        solved = scheduler.step(v, scheduler.timesteps[k], z, return_dict=False)[0]
        z = latents[:, k + 1] if k < 3 else solved
    torch.testing.assert_close(latents[:, -1], z, rtol=1e-5, atol=1e-6)


def test_a_tail_is_for_whole_trajectories_from_step_zero():
    sigmas = grid()
    tail = MultistepTail(multistep_solver("dpmsolver++"), sigmas, 3)
    with pytest.raises(ValueError, match="whole trajectories from step 0"):
        sample_from(velocity, torch.zeros(2, *SHAPE), sigmas, 2, tail=tail)
    with pytest.raises(ValueError, match="outside the 6 steps"):
        MultistepTail(multistep_solver("dpmsolver++"), sigmas, 7)
    with pytest.raises(ValueError, match="choose one of"):
        multistep_solver("unipc")
