"""Flow-DPPO and GRPO-Guard (``flowrl/losses/mean_shift.py``): hand cases, the exact divergence, NaN-safety, the
RatioNorm bias over noise draws, and each against its authors' arithmetic (loss and gradient to 1e-6)."""

import pytest
import torch

from flowrl import losses
from flowrl.sampling.steps import gaussian_log_prob


def run(name, log_prob, old, adv, mask=None, **step_and_options):
    log_prob = torch.tensor(log_prob, dtype=torch.float64, requires_grad=True)
    mask = torch.ones_like(log_prob, dtype=torch.bool) if mask is None else torch.tensor(mask)
    names = losses.policy_loss_needs(name)
    inputs = {k: torch.tensor(v, dtype=torch.float64) for k, v in step_and_options.items() if k in names}
    options = {k: v for k, v in step_and_options.items() if k not in names}
    loss, metrics = losses.policy_loss(name, log_prob, torch.tensor(old, dtype=torch.float64),
                                       torch.tensor(adv, dtype=torch.float64), mask, step_inputs=inputs, **options)
    loss.sum().backward()
    return loss.detach(), log_prob.grad, metrics


# -- Flow-DPPO --------------------------------------------------------------------------------------------------


def test_dppo_four_mask_cases_outside_the_trust_region():
    # D = 0.02 / (2 * 0.1^2) = 1 >= 1e-5 everywhere; r = e^0.1 > 1 or e^-0.1 < 1
    r_up, r_down = 0.1, -0.1
    loss, grad, m = run("dppo", [[r_up, r_up, r_down, r_down]], [[0.0] * 4], [[1.0, -1.0, -1.0, 1.0]],
                        mean_sq_diff=[[0.02] * 4], std=[[0.1] * 4])
    e_up, e_down = torch.tensor(r_up).exp().item(), torch.tensor(r_down).exp().item()
    # pushes further out (r > 1, A > 0; r < 1, A < 0): dropped, no gradient; corrective: -A r, gradient -A r
    assert loss[0].tolist() == pytest.approx([0.0, e_up, 0.0, -e_down])
    assert grad[0].tolist() == pytest.approx([0.0, e_up, 0.0, -e_down])
    assert m["dppo_masked_frac"].item() == 0.5 and m["dppo_divergence"].item() == pytest.approx(1.0)


def test_dppo_inside_the_trust_region_keeps_every_pair():
    # D = 1e-8 / (2 * 0.1^2) = 5e-7 < 1e-5: nothing is dropped whatever the direction
    loss, grad, m = run("dppo", [[0.1, -0.1]], [[0.0, 0.0]], [[1.0, -1.0]], mean_sq_diff=[[1e-8] * 2],
                        std=[[0.1] * 2])
    assert grad[0].tolist() == pytest.approx([-torch.tensor(0.1).exp().item(), torch.tensor(-0.1).exp().item()])
    assert m["dppo_masked_frac"].item() == 0


def test_dppo_on_policy_first_step_is_the_policy_gradient():
    # replayed old log-probs: r = 1 exactly, D = 0: loss -A, gradient -A
    loss, grad, m = run("dppo", [[-0.3, 0.2]], [[-0.3, 0.2]], [[2.0, -0.5]], mean_sq_diff=[[0.0, 0.0]],
                        std=[[0.2, 0.3]])
    assert loss.tolist() == [[-2.0, 0.5]] and grad.tolist() == [[-2.0, 0.5]]
    assert m["ratio_min"].item() == m["ratio_max"].item() == 1.0


def test_dppo_overflowing_ratio_on_a_dropped_pair_is_finite_in_loss_and_gradient():
    loss, grad, _ = run("dppo", [[1e4, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], mean_sq_diff=[[1.0, 0.0]],
                        std=[[0.1, 0.1]])
    assert loss.tolist() == [[0.0, -1.0]] and torch.isfinite(grad).all() and grad[0, 0] == 0
    # a masked (padding) position with nan inputs reaches neither the loss nor the gradient
    loss, grad, _ = run("dppo", [[float("nan"), 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], mask=[[False, True]],
                        mean_sq_diff=[[float("nan"), 0.0]], std=[[0.0, 0.1]])
    assert loss.tolist() == [[0.0, -1.0]] and grad.tolist() == [[0.0, -1.0]]


def test_dppo_divergence_is_the_gaussian_kl_per_dimension():
    torch.manual_seed(0)
    mu_new, mu_old, s = torch.randn(8), torch.randn(8), 0.3
    kl = torch.distributions.kl_divergence(torch.distributions.Normal(mu_new, s),
                                           torch.distributions.Normal(mu_old, s)).mean()
    _, _, m = run("dppo", [[0.0]], [[0.0]], [[1.0]], mean_sq_diff=[[(mu_new - mu_old).square().mean().item()]],
                  std=[[s]])
    assert m["dppo_divergence"].item() == pytest.approx(kl.item(), rel=1e-6)


def unirl_flowdppo_kl_adv_loss(new_logp, old_logp, new_means, old_means, advantages, sigma_t, threshold):
    """Tencent-Hunyuan/UniRL ``unirl/algorithms/flowdppo.py`` ``_flowdppo_kl_adv_loss`` (with ``_gaussian_kl_div``)
    and ``compute_loss_and_backward``'s ``loss_per_elem.mean()``, written from reading the file at 1a7b501."""
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages.detach()
    unclipped = -adv * ratio
    kl = ((new_means - old_means) ** 2 / (2 * sigma_t**2)).mean(dim=tuple(range(2, new_means.ndim)))
    inside = kl < threshold
    removed = ((~inside) & (ratio > 1.0) & (adv > 0)) | ((~inside) & (ratio < 1.0) & (adv < 0))
    return torch.where(~removed, unclipped, torch.zeros(())).mean()


def test_dppo_equals_unirl_loss_and_gradient():
    torch.manual_seed(1)
    B, S = 4, 3
    new_means = torch.randn(B, S, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    old_means = (new_means + 0.002 * torch.randn_like(new_means)).detach()
    old_means[0] = new_means[0].detach()  # one row on-policy: D = 0
    new_logp = (0.01 * torch.randn(B, S, dtype=torch.float64)).requires_grad_()
    old_logp = torch.zeros(B, S, dtype=torch.float64)
    adv = torch.randn(B, 1, dtype=torch.float64).expand(B, S)
    sigma_t = torch.tensor([0.05, 0.1, 0.2], dtype=torch.float64).view(1, S, 1, 1, 1)
    theirs = unirl_flowdppo_kl_adv_loss(new_logp, old_logp, new_means, old_means, adv, sigma_t, 1e-5)
    g_theirs = torch.autograd.grad(theirs, (new_logp, new_means), allow_unused=True)
    msd = (new_means - old_means).square().flatten(2).mean(2)
    loss, m = losses.policy_loss("dppo", new_logp, old_logp, adv, torch.ones(B, S, dtype=torch.bool),
                                 step_inputs={"mean_sq_diff": msd, "std": sigma_t.view(1, S).expand(B, S)},
                                 kl_threshold=1e-5)
    ours = losses.aggregate(loss, torch.ones(B, S, dtype=torch.bool), "token-mean")
    g_ours = torch.autograd.grad(ours, (new_logp, new_means), allow_unused=True)
    assert 0 < m["dppo_masked_frac"] < 1  # the case mixes dropped and kept pairs
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert torch.allclose(g_ours[0], g_theirs[0], atol=1e-6)
    assert g_theirs[1] is None and (g_ours[1] is None or not g_ours[1].any())  # the mask passes no gradient


# -- GRPO-Guard -------------------------------------------------------------------------------------------------


def test_guard_bias_cancels_the_mean_shift_over_noise_draws():
    torch.manual_seed(2)
    draws, d, s = 20000, 16, 0.2
    mu_old = torch.randn(1, d)
    mu_new = mu_old + 0.1 * torch.randn(1, d)  # a pure mean shift
    z = mu_old + s * torch.randn(draws, d)  # the recorded sample, from the old step
    std = torch.tensor(s)
    plain = gaussian_log_prob(z, mu_new.expand(draws, d), std) - gaussian_log_prob(z, mu_old.expand(draws, d), std)
    D = (mu_new - mu_old).square().mean() / (2 * s**2)
    corrected = (plain + D) * s
    stderr = corrected.std() / draws**0.5
    assert plain.mean() < -D / 2  # Flow-GRPO's log-ratio is biased down by D
    assert corrected.mean().abs() < 4 * stderr  # RatioNorm's averages 0
    loss, _ = losses.policy_loss("grpo_guard", plain[:, None], torch.zeros(draws, 1), torch.ones(draws, 1),
                                 torch.ones(draws, 1, dtype=torch.bool), step_inputs={
                                     "mean_sq_diff": (mu_new - mu_old).square().mean().expand(draws, 1),
                                     "std": std.expand(draws, 1), "dt": torch.ones(draws, 1)}, clip_low=1.0)
    assert torch.allclose(loss[:, 0], -corrected.exp(), atol=1e-6)  # the same corrected ratio, unclipped at clip 1


def test_guard_clips_the_corrected_ratio_and_divides_by_dt():
    # b = 0.02 / (2 * 0.1^2) = 1: (0.1 - 1 + 1) * 0.1 = 0.01, r~ = e^0.01 > 1 + 2e-6
    loss, grad, m = run("grpo_guard", [[0.1]], [[0.0]], [[1.0]], mean_sq_diff=[[0.02]], std=[[0.1]], dt=[[0.25]])
    assert loss.item() == pytest.approx(-(1 + 2e-6) / 0.25) and grad.item() == 0.0
    assert m["clip_frac_high"].item() == 1 and m["guard_bias"].item() == pytest.approx(1.0)


def flow_grpo_guard_loss(log_prob, old_log_prob, prev_sample_mean, old_prev_sample_mean, advantages, std_dev_t,
                         sqrt_dt, clip_range):
    """``zhtmike/flow_grpo`` ``scripts/train_sd3_GRPO_Guard.py`` (``main``, the ``config.rationorm`` loss block of one
    micro-batch at timestep ``j``, @2e2f712), written from reading it: ``.mean(dim=tuple(range(1, log_prob.ndim)))``
    with a ``[B]`` log-prob is ``mean(dim=())``, every dim: one bias per micro-batch."""
    sigma_t = std_dev_t.mean()
    bias = (prev_sample_mean - old_prev_sample_mean).pow(2).mean(dim=tuple(range(1, log_prob.ndim)))
    bias = bias / (2 * (sqrt_dt.mean() * sigma_t) ** 2)
    ratio = torch.exp((log_prob - old_log_prob + bias) * (sqrt_dt.mean() * sigma_t))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.mean(torch.maximum(unclipped, clipped)) / (sqrt_dt.mean() ** 2)


def test_guard_step_bias_equals_the_authors_loss_and_gradient():
    torch.manual_seed(3)
    B = 5
    mean = torch.randn(B, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    old_mean = (mean + 0.01 * torch.randn_like(mean)).detach()
    log_prob = (-1.0 + 1e-5 * torch.randn(B, dtype=torch.float64)).requires_grad_()
    old_log_prob = torch.full((B,), -1.0, dtype=torch.float64)
    adv = torch.randn(B, dtype=torch.float64)
    std_dev_t, sqrt_dt = torch.full((B, 1, 1, 1), 0.9, dtype=torch.float64), torch.full((B, 1, 1, 1), 0.3,
                                                                                         dtype=torch.float64)
    theirs = flow_grpo_guard_loss(log_prob, old_log_prob, mean, old_mean, adv, std_dev_t, sqrt_dt, 2e-6)
    g_theirs = torch.autograd.grad(theirs, (log_prob, mean))
    msd = (mean - old_mean).square().flatten(1).mean(1)
    ones = torch.ones(B, 1, dtype=torch.float64)
    loss, m = losses.policy_loss("grpo_guard", log_prob[:, None], old_log_prob[:, None], adv[:, None],
                                 torch.ones(B, 1, dtype=torch.bool), step_inputs={
                                     "mean_sq_diff": msd[:, None], "std": ones * 0.27, "dt": ones * 0.09},
                                 clip_low=2e-6, bias_over="step")
    ours = loss.mean()
    g_ours = torch.autograd.grad(ours, (log_prob, mean))
    assert 0 < m["clip_frac"] < 1  # both branches of the clip are exercised
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_ours, g_theirs))


def test_guard_pair_bias_is_per_row():
    # rows at one step with mean shifts 0.02 and 0: b = 1 and 0 per pair; the step mean gives both b = 0.5
    kwargs = dict(mean_sq_diff=[[0.02], [0.0]], std=[[0.1], [0.1]], dt=[[1.0], [1.0]], clip_low=1.0)
    _, _, pair = run("grpo_guard", [[0.0], [0.0]], [[0.0], [0.0]], [[1.0], [1.0]], **kwargs)
    _, _, step = run("grpo_guard", [[0.0], [0.0]], [[0.0], [0.0]], [[1.0], [1.0]], bias_over="step", **kwargs)
    assert pair["ratio_max"].item() == pytest.approx(torch.tensor(0.1).exp().item())
    assert step["ratio_max"].item() == pytest.approx(torch.tensor(0.05).exp().item())


def test_missing_step_input_and_bad_option_are_named():
    with pytest.raises(ValueError, match="needs the step inputs \\['dt'\\]"):
        run("grpo_guard", [[0.0]], [[0.0]], [[1.0]], mean_sq_diff=[[0.0]], std=[[0.1]])
    with pytest.raises(ValueError, match="bias_over='batch' must be"):
        losses.check_policy_loss("grpo_guard", bias_over="batch")
    assert "mean_sq_diff" not in losses.policy_loss_options("dppo")
