"""KL estimators (values, verl's clamps, straight-through gradients), the Gaussian mean KL and the entropy."""

import math

import pytest
import torch

from flowrl.losses import KL_ESTIMATORS, entropy_from_logits, gaussian_mean_kl, kl, kl_convention_scale

LOG2 = math.log(2.0)


def values(name, d):
    lp = torch.tensor([d], requires_grad=True)
    out = kl(name, lp, torch.zeros(1))
    out.sum().backward()
    return out.item(), lp.grad.item()


def test_estimators_by_hand():
    # d = log_prob - ref = +log 2 and -log 2
    # k1 = d; abs = |d|; k2 = d^2 / 2 = 0.240227; k3 = exp(-d) + d - 1: 0.5 + 0.693147 - 1 = 0.193147 and
    # 2 - 0.693147 - 1 = 0.306853
    assert [values(n, LOG2)[0] for n in ("k1", "abs", "k2", "k3")] == pytest.approx(
        [LOG2, LOG2, LOG2**2 / 2, 0.5 + LOG2 - 1])
    assert [values(n, -LOG2)[0] for n in ("k1", "abs", "k2", "k3")] == pytest.approx(
        [-LOG2, LOG2, LOG2**2 / 2, 2 - LOG2 - 1])
    # verl's names
    assert [values(n, LOG2)[0] for n in ("kl", "mse", "low_var_kl")] == pytest.approx([LOG2, LOG2**2 / 2, 0.5 + LOG2 - 1])


def test_k3_is_clamped_as_verl():
    # d = -30: -d clamped to 20, exp(20) - 20 - 1 clamped to 10 (flat: no gradient); d = 30: exp(-20) + 20 - 1 = 19
    # -> 10
    assert values("k3", -30.0) == (10.0, 0.0) and values("k3", 30.0)[0] == 10.0


def test_straight_through_has_the_value_of_the_estimator_and_the_gradient_of_k2():
    # gradients at d = log 2: k1 -> 1, k3 -> 1 - exp(-d) = 0.5, abs -> 1, k2 -> d = 0.693147
    assert values("k3", LOG2)[1] == pytest.approx(0.5) and values("k1", LOG2)[1] == pytest.approx(1.0)
    for name, value in (("k3+", 0.5 + LOG2 - 1), ("k1+", LOG2), ("abs+", LOG2), ("low_var_kl+", 0.5 + LOG2 - 1)):
        assert values(name, LOG2) == pytest.approx((value, LOG2)), name
    assert values("k2+", LOG2) == pytest.approx(values("k2", LOG2))
    # the reference gets the opposite gradient, and a masked-out position none once aggregated
    lp, ref = torch.tensor([[LOG2, 5.0]]), torch.zeros(1, 2, requires_grad=True)
    (kl("k3+", lp, ref) * torch.tensor([[1.0, 0.0]])).sum().backward()
    assert ref.grad[0].tolist() == pytest.approx([-LOG2, 0.0])


def test_unknown_estimator_fails_clearly():
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; available: \['abs', 'abs\+', 'k1'"):
        kl("k4", torch.zeros(1), torch.zeros(1))
    assert len(KL_ESTIMATORS) == 8


def test_gaussian_mean_kl():
    # ((1 - 0)^2 + (3 - 0)^2) / 2 dims / (2 * 1^2) = 2.5
    out = gaussian_mean_kl(torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2), torch.ones(1, 1))
    assert out.item() == pytest.approx(2.5)


def test_entropy_from_logits():
    # p = [1/4, 3/4] (logits 0, log 3): H = 0.25 ln 4 + 0.75 ln(4/3) = 0.562335
    assert entropy_from_logits(torch.tensor([0.0, math.log(3.0)])).item() == pytest.approx(0.562335, abs=1e-6)
    # a softmax that underflows to 0 keeps H finite (here ~0), where -sum p log p would give nan
    assert entropy_from_logits(torch.tensor([0.0, -1000.0])).item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    oracle = torch.distributions.Categorical(logits=logits).entropy()
    assert entropy_from_logits(logits).shape == (3, 5) and torch.allclose(entropy_from_logits(logits), oracle)


def test_both_kl_conventions_by_hand():
    # a Flow-GRPO SDE step from sigma 1.0 to 0.9 with s = 0.5: the step's std is s sqrt(|dt|) = 0.5 sqrt(0.1)
    # mean gap 1 in every dim: exact KL = 1 / (2 * 0.25 * 0.1) = 20; flow_grpo's train_sd3.py: 1 / (2 * 0.25) = 2
    mean, ref = torch.ones(1, 4), torch.zeros(1, 4)
    std = torch.full((1, 1), 0.5 * math.sqrt(0.1))
    exact = gaussian_mean_kl(mean, ref, std)
    assert exact.item() == pytest.approx(20.0, rel=1e-5)
    sigma, sigma_next = torch.tensor([1.0]), torch.tensor([0.9])
    assert (exact * kl_convention_scale("flow_grpo", "flow_grpo", sigma, sigma_next)).item() == pytest.approx(2.0)
    assert (exact * kl_convention_scale("exact", "flow_grpo", sigma, sigma_next)).item() == pytest.approx(20.0)
    # flow_grpo's CPS step returns the step's own std: its KL is the exact one
    assert kl_convention_scale("flow_grpo", "cps", sigma, sigma_next).item() == 1.0
    with pytest.raises(ValueError, match="unknown KL convention 'flowgrpo'"):
        kl_convention_scale("flowgrpo", "flow_grpo", sigma, sigma_next)
