"""The DDIM step against diffusers' ``DDIMScheduler.step`` (SD1.5's schedule) and an independent Gaussian density."""

import math

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler
from scipy.stats import norm

from flowrl.sampling.sampler import sample, sde_steps, trained_steps
from flowrl.sampling.steps import ODE_STEPS, PREDICTIONS, STEPS, ddim_ode_step, ddim_step, ode_kind

SD15 = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
            set_alpha_to_one=False, steps_offset=1)


def sd15_grid(num_steps: int):
    """diffusers' DDIM timesteps for SD1.5 and the matching noise-to-signal ratios ``[T + 1]``."""
    scheduler = DDIMScheduler(**SD15)
    scheduler.set_timesteps(num_steps)
    alphas = torch.cat([scheduler.alphas_cumprod[scheduler.timesteps], scheduler.final_alpha_cumprod[None]])
    return scheduler, ((1 - alphas.double()) / alphas.double()).sqrt().float()


@pytest.mark.parametrize("eta", [1.0, 0.5, 0.0])
def test_ddim_step_equals_diffusers_ddim_scheduler(eta):
    scheduler, sigmas = sd15_grid(10)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 4, 8, 8, generator=gen)
    for k, t in enumerate(scheduler.timesteps):
        eps, noise = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 4, 8, 8, generator=gen)
        expected = scheduler.step(eps, t, z, eta=eta, variance_noise=noise).prev_sample
        ours = ddim_step(z, eps, sigmas[k], sigmas[k + 1], noise=noise, noise_level=eta)
        # relative to the latent scale (x0_hat reaches ~15 at t=981); diffusers rounds x0_hat to float32 first
        assert torch.allclose(ours.z_next, expected, rtol=1e-5, atol=2e-5), (k, (ours.z_next - expected).abs().max())
        z = expected


def test_ddim_log_prob_is_the_gaussian_density_averaged_over_dimensions():
    _, sigmas = sd15_grid(50)
    gen = torch.Generator().manual_seed(1)
    z, eps, noise = (torch.randn(3, 4, 4, 4, generator=gen) for _ in range(3))
    k = 7
    out = ddim_step(z, eps, sigmas[k], sigmas[k + 1], noise=noise, noise_level=1.0)
    # DDIM variance from the alphas directly (Eq. 16), independent of the sigma algebra inside the step
    a, a_next = 1 / (1 + sigmas[k].double() ** 2), 1 / (1 + sigmas[k + 1].double() ** 2)
    std = math.sqrt((1 - a_next) / (1 - a) * (1 - a / a_next))
    assert out.std.flatten()[0].item() == pytest.approx(std, rel=1e-6)
    density = norm.logpdf(out.z_next.numpy(), loc=out.mean.numpy(), scale=std).reshape(3, -1).mean(1)
    assert np.allclose(out.log_prob.numpy(), density, atol=1e-5)
    # scoring the recorded sample gives the same value (the training-time recompute)
    again = ddim_step(z, eps, sigmas[k], sigmas[k + 1], z_next=out.z_next, noise_level=1.0)
    assert torch.equal(again.log_prob, out.log_prob)


def test_eta_zero_is_deterministic_with_zero_log_prob():
    _, sigmas = sd15_grid(5)
    z, eps = torch.randn(2, 1, 3, 3), torch.randn(2, 1, 3, 3)
    a = ddim_step(z, eps, sigmas[1], sigmas[2], noise=torch.randn(2, 1, 3, 3), noise_level=0.0)
    b = ddim_step(z, eps, sigmas[1], sigmas[2], noise=torch.randn(2, 1, 3, 3), noise_level=0.0)
    c = ddim_ode_step(z, eps, sigmas[1], sigmas[2], noise_level=0.9)
    assert torch.equal(a.z_next, b.z_next) and torch.equal(a.z_next, c.z_next) and torch.equal(a.z_next, a.mean)
    assert (a.log_prob == 0).all() and (c.std == 0).all()
    # mixed per-sample eta: the eta = 0 row is deterministic, the other has a real density
    mixed = ddim_step(z, eps, sigmas[1], sigmas[2], noise=torch.randn(2, 1, 3, 3), noise_level=torch.tensor([0.0, 1.0]))
    assert mixed.log_prob[0] == 0 and torch.isfinite(mixed.log_prob).all() and mixed.log_prob[1] != 0
    with pytest.raises(ValueError, match="needs `noise`"):
        ddim_step(z, eps, sigmas[1], sigmas[2], noise_level=1.0)


def test_every_kind_declares_its_prediction_and_ode():
    assert set(PREDICTIONS) == set(STEPS) and set(ODE_STEPS.values()) <= set(STEPS)
    assert ode_kind("ddim") == "ddim_ode" and ode_kind("cps") == "ode"
    assert not sde_steps(4, "ddim_ode").any() and sde_steps(4, "ddim").all()


def test_sampler_with_ddim_reproduces_the_scheduler_loop_and_trains_moving_steps():
    scheduler, sigmas = sd15_grid(4)
    eps_model = lambda z, sigma, rows=None: 0.3 * z + sigma.view(-1, 1, 1, 1) / 20  # noqa: E731  any fixed function
    seeds = torch.tensor([5])
    latents, log_probs = sample(eps_model, seeds, sigmas, (1, 2, 2), "ddim", 0.0, sde_steps(4, "ddim_ode"))
    z = latents[:, 0]
    for k, t in enumerate(scheduler.timesteps):
        z = scheduler.step(eps_model(z, sigmas[k].expand(1)), t, z, eta=0.0).prev_sample
    assert torch.allclose(latents[:, -1], z, atol=1e-5) and (log_probs == 0).all()
    mask = torch.ones(4, dtype=torch.bool)
    assert trained_steps(mask, 1.0, sigmas, "ddim").all()
    # steps_offset 0 ends on t = 0 with alpha_prev = alpha_0: sigma does not move, std is 0, not trained
    flat = torch.cat([sigmas[:-1], sigmas[-2:-1]])
    assert trained_steps(mask, 1.0, flat, "ddim").tolist() == [True, True, True, False]
    assert ddim_step(z, z, flat[-2], flat[-1], noise=torch.ones_like(z), noise_level=1.0).log_prob.item() == 0
