"""Sampler steps against hand-computed numbers and an independent Gaussian density (scipy)."""

import math

import pytest
import torch
from scipy.stats import norm

from flowrl.sampling.steps import STEPS, cps_step, dance_step, flow_grpo_step, gaussian_log_prob, get_step, ode_step

Z, V, S, S_NEXT, A = torch.tensor([[0.5]]), torch.tensor([[-1.0]]), 0.7904, 0.7073, 0.7


def test_flow_grpo_step_matches_hand_computation():
    # dt = -0.0831; s = 0.7 * sqrt(0.7904 / 0.2096) = 1.3593; std = s * sqrt(0.0831) = 0.3919
    # mean = 0.5 * (1 - s^2 * 0.0831 / 1.5808) + 0.0831 * (1 + s^2 * 0.2096 / 1.5808) = 0.45143 + 0.10346
    out = flow_grpo_step(Z, V, S, S_NEXT, noise=torch.zeros(1, 1), noise_level=A)
    assert out.std.item() == pytest.approx(0.3919, abs=1e-4)
    assert out.mean.item() == pytest.approx(0.5549, abs=1e-4)
    assert out.z_next.item() == pytest.approx(out.mean.item())


def test_ode_cps_and_dance_match_hand_computation():
    assert ode_step(Z, V, S, S_NEXT).z_next.item() == pytest.approx(0.5831, abs=1e-4)  # 0.5 + 0.0831
    # CPS: std = 0.7073 sin(0.35 pi) = 0.6302; x0 = 1.2904, eps = 0.2904; mean = 1.2904*0.2927 + 0.2904*0.3211
    cps = cps_step(Z, V, S, S_NEXT, noise=torch.zeros(1, 1), noise_level=A)
    assert (cps.std.item(), cps.mean.item()) == pytest.approx((0.6302, 0.4709), abs=1e-4)
    # Dance (eta 0.3): std = 0.3 sqrt(0.0831) = 0.0865; mean = 0.5831 - 0.045 * score * dt, score = -0.3674
    dance = dance_step(Z, V, S, S_NEXT, noise=torch.zeros(1, 1), noise_level=0.3)
    assert (dance.std.item(), dance.mean.item()) == pytest.approx((0.0865, 0.5817), abs=1e-4)


@pytest.mark.parametrize("kind", ["flow_grpo", "cps", "dance"])
def test_log_prob_is_the_gaussian_density_averaged_over_dims(kind):
    gen = torch.Generator().manual_seed(0)
    z, v, noise = (torch.randn(3, 2, 4, 4, generator=gen) for _ in range(3))
    sigma, sigma_next = torch.tensor([0.9, 0.5, 0.3]), torch.tensor([0.8, 0.4, 0.1])
    out = get_step(kind)(z, v, sigma, sigma_next, noise=noise, noise_level=0.7)
    std = out.std.expand_as(out.mean)
    expected = norm.logpdf(out.z_next.double().numpy(), out.mean.double().numpy(), std.double().numpy())
    assert torch.allclose(out.log_prob.double(), torch.from_numpy(expected).flatten(1).mean(1), atol=1e-5)
    # scoring the recorded sample again gives the same value (the PPO ratio is 1 on-policy)
    again = get_step(kind)(z, v, sigma, sigma_next, z_next=out.z_next, noise_level=0.7)
    assert torch.equal(again.log_prob, out.log_prob)


def test_sigma_one_uses_sigma_next_in_the_denominator():
    # flow_grpo substitutes sigmas[1] when sigma == 1: s = 0.7 * sqrt(1 / (1 - 0.9))
    out = flow_grpo_step(Z, V, 1.0, 0.9, noise=torch.zeros(1, 1), noise_level=A)
    assert torch.isfinite(out.log_prob).all()
    assert out.std.item() == pytest.approx(0.7 * math.sqrt(10) * math.sqrt(0.1), rel=1e-5)


def test_per_sample_noise_level_equals_separate_calls():
    z, v = torch.randn(2, 3), torch.randn(2, 3)
    both = flow_grpo_step(z, v, 0.6, 0.5, noise=torch.zeros(2, 3), noise_level=torch.tensor([0.5, 0.9]))
    first = flow_grpo_step(z[:1], v[:1], 0.6, 0.5, noise=torch.zeros(1, 3), noise_level=0.5)
    assert torch.allclose(both.mean[:1], first.mean) and torch.allclose(both.std[:1], first.std)
    assert not torch.allclose(both.std[0], both.std[1])


def test_unknown_kind_and_missing_noise_are_clear_errors():
    with pytest.raises(ValueError, match="unknown sampler step 'sde'"):
        get_step("sde")
    with pytest.raises(ValueError, match="needs `noise`"):
        flow_grpo_step(Z, V, S, S_NEXT)
    assert set(STEPS) == {"flow_grpo", "cps", "dance", "ode", "ddim", "ddim_ode"}


def test_gaussian_log_prob_of_mean_is_minus_log_std_sqrt_2pi():
    std = torch.full((1, 1), 2.0)
    assert gaussian_log_prob(torch.zeros(1, 5), torch.zeros(1, 5), std).item() == pytest.approx(
        -math.log(2.0) - 0.5 * math.log(2 * math.pi))
