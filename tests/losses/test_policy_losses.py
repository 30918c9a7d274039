"""Every policy loss against hand-computed values, its gradient where the gradient is the point, masks with holes
and padded rows, and the errors for unknown names and options."""

import math

import pytest
import torch

from flowrl import losses

ONE = torch.ones(1, 1, dtype=torch.bool)


def run(name, log_prob, old, adv, mask=None, **options):
    log_prob = torch.tensor(log_prob, requires_grad=True)
    mask = torch.ones_like(log_prob, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    loss, metrics = losses.policy_loss(name, log_prob, torch.tensor(old), torch.tensor(adv), mask, **options)
    loss.sum().backward()
    return loss.detach(), log_prob.grad, metrics


def test_ppo_clip_flow_grpo_example():
    # A = 1, ratio = 1.00015, eps = 1e-4: max(-1.00015, -1.0001) = -1.0001 (clipped: no gradient)
    loss, grad, m = run("vanilla", [[math.log(1.00015)]], [[0.0]], [[1.0]], clip_low=1e-4)
    assert loss.item() == pytest.approx(-1.0001, abs=1e-7) and grad.item() == 0.0
    assert m["clip_frac"] == 1 and m["clip_frac_high"] == 1 and m["clip_frac_low"] == 0


def test_ppo_unclipped_gradient_is_minus_advantage_times_ratio():
    # ratio 1 (log_prob = old): loss = -A, d loss / d log_prob = -A r = -A
    loss, grad, m = run("vanilla", [[0.0, 0.0]], [[0.0, 0.0]], [[2.0, -3.0]])
    assert loss.tolist() == [[-2.0, 3.0]] and grad.tolist() == [[-2.0, 3.0]]
    assert m["approx_kl"] == 0 and m["clip_frac"] == 0 and m["ratio_min"] == m["ratio_max"] == 1


def test_dapo_clip_higher_is_asymmetric():
    # r = 1.25, A = 1: inside [0.8, 1.28] -> -1.25 with gradient -A r = -1.25; symmetric 0.2 clips to -1.2, grad 0
    lp = [[math.log(1.25)]]
    loss, grad, _ = run("vanilla", lp, [[0.0]], [[1.0]], clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and grad.item() == pytest.approx(-1.25)
    loss, grad, m = run("vanilla", lp, [[0.0]], [[1.0]], clip_low=0.2)
    assert loss.item() == pytest.approx(-1.2) and grad.item() == 0 and m["clip_frac_high"] == 1
    # r = 0.75, A = -1: the lower bound stays 1 - 0.2 = 0.8 -> max(0.75, 0.8) = 0.8, clipped below
    loss, grad, m = run("vanilla", [[math.log(0.75)]], [[0.0]], [[-1.0]], clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(0.8) and grad.item() == 0
    assert m["clip_frac_low"] == 1 and m["clip_frac_high"] == 0


def test_dual_clip_bounds_negative_advantages():
    # A = -1: r = 5 -> max(5, 1.2) = 5, dual clip c = 3 -> min(5, 3) = 3 (constant: no gradient);
    # r = 2 -> max(2, 1.2) = 2 < 3 stays, gradient -A r = 2; A = +1, r = 5 -> -1.2 (the dual clip is for A < 0 only)
    lp = [[math.log(5.0), math.log(2.0), math.log(5.0)]]
    loss, grad, m = run("vanilla", lp, [[0.0] * 3], [[-1.0, -1.0, 1.0]], dual_clip=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, 2.0, -1.2]) and grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0])
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 3) and m["clip_frac_high"].item() == pytest.approx(1 / 3)
    loss, grad, m = run("vanilla", lp, [[0.0] * 3], [[-1.0, -1.0, 1.0]])  # off: the unbounded 5 with gradient 5
    assert loss[0, 0].item() == pytest.approx(5.0) and grad[0, 0].item() == pytest.approx(5.0)
    assert m["dual_clip_frac"] == 0


def test_metrics_are_masked_and_padding_gets_no_gradient():
    # row 0 has a hole at t=1, row 1 is padded after t=0 with -inf / nan (what a padded LLM batch may hold)
    nan, inf = float("nan"), float("inf")
    lp = [[math.log(2.0), 7.0, 0.0], [math.log(0.5), -inf, nan]]
    mask = [[True, False, True], [True, False, False]]
    loss, grad, m = run("vanilla", lp, [[0.0] * 3] * 2, [[1.0, 1.0, 1.0], [1.0, nan, nan]], mask, clip_low=0.2)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert loss[0, 1] == 0 and loss[1, 1:].abs().sum() == 0 and grad[0, 1] == 0 and grad[1, 1:].abs().sum() == 0
    # valid ratios 2, 1, 0.5 (A = 1): only r = 2 is clipped -> 1/3
    assert m["clip_frac"].item() == pytest.approx(1 / 3)
    assert m["ratio_mean"].item() == pytest.approx(3.5 / 3) and m["ratio_min"] == 0.5 and m["ratio_max"] == 2.0
    # approx_kl = mean(0.5 log^2 r) = 0.5 * 2 * log(2)^2 / 3; ppo_kl = mean(-log r) = 0
    assert m["approx_kl"].item() == pytest.approx(math.log(2) ** 2 / 3) and m["ppo_kl"].item() == pytest.approx(0)


def test_gspo_uses_the_sequence_geometric_mean_ratio():
    # row 0: log r = [0.2, 0.4], s = exp(0.3) = 1.34986 at both positions (third position padded);
    # row 1: log r = [-0.1, -0.1, -0.1], s = exp(-0.1) = 0.904837
    lp = torch.tensor([[0.2, 0.4, 5.0], [-0.1, -0.1, -0.1]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([[1.0], [-2.0]])
    loss, m = losses.policy_loss("gspo", lp, torch.zeros(2, 3), adv, mask, clip_low=0.5)
    s0, s1 = math.exp(0.3), math.exp(-0.1)
    assert torch.allclose(loss, torch.tensor([[-s0, -s0, 0.0], [2 * s1] * 3]), atol=1e-6)
    assert m["ratio_max"].item() == pytest.approx(s0) and m["ratio_min"].item() == pytest.approx(s1)
    # its gradient is the GSPO paper's: seq-mean-token-mean of the loss == mean_i(-A_i s_i), s_i a function of
    # the whole row, so an independent autograd of that formula gives the same gradient
    losses.aggregate(loss, mask, "seq-mean-token-mean").backward()
    oracle_lp = lp.detach().clone().requires_grad_(True)
    m_f = mask.float()
    s = torch.exp((oracle_lp * m_f).sum(1) / m_f.sum(1))
    (-(adv[:, 0] * s)).mean().backward()
    assert torch.allclose(lp.grad, oracle_lp.grad, atol=1e-6)
    # d/d lp_0t = -A s0 / (L_0 = 2) / (2 rows) = -0.337465
    assert lp.grad[0, 0].item() == pytest.approx(-s0 / 4) and lp.grad[0, 2] == 0


def test_gspo_clips_whole_rows():
    # s = exp(0.3) = 1.35 > 1 + 0.2 with A = 1: every position is clipped (value -1.2, no gradient)
    loss, grad, m = run("gspo", [[0.2, 0.4]], [[0.0, 0.0]], [[1.0, 1.0]], clip_low=0.2)
    assert loss[0].tolist() == pytest.approx([-1.2, -1.2]) and grad.abs().sum() == 0 and m["clip_frac_high"] == 1
    assert losses.is_sequence_level("gspo") and not losses.is_sequence_level("vanilla")


def test_gpg_is_reinforce_whatever_the_ratio():
    # -A log_prob = -0.5 * -2 = 1; gradient -A = -0.5 though the ratio is e^3 (no clip, no ratio in the gradient)
    loss, grad, m = run("gpg", [[-2.0]], [[-5.0]], [[0.5]])
    assert loss.item() == pytest.approx(1.0) and grad.item() == pytest.approx(-0.5)
    assert m["ratio_max"].item() == pytest.approx(math.exp(3)) and m["clip_frac"] == 0


def test_cispo_keeps_the_gradient_of_clipped_positions():
    # t0: r = e^(-1 - -2) = e > 1.2 -> weight sg(1.2): loss -1.2 * 1 * (-1) = 1.2, gradient -1.2 * A = -1.2
    # t1: r = e^-1 = 0.368 < 0.8 -> weight sg(0.8): loss -0.8 * (-1) * (-2) = -1.6, gradient -0.8 * A = 0.8
    loss, grad, m = run("cispo", [[-1.0, -2.0]], [[-2.0, -1.0]], [[1.0, -1.0]])
    assert loss[0].tolist() == pytest.approx([1.2, -1.6]) and grad[0].tolist() == pytest.approx([-1.2, 0.8])
    assert m["clip_frac_high"] == 0.5 and m["clip_frac_low"] == 0.5 and m["clip_frac"] == 1
    # TRL's min(r, epsilon_high = 5) is clip_low=1, clip_high=4: r = e^2 = 7.39 -> weight 5, gradient -5 * A
    loss, grad, _ = run("cispo", [[0.0]], [[-2.0]], [[1.0]], clip_low=1.0, clip_high=4.0)
    assert loss.item() == 0 and grad.item() == pytest.approx(-5.0)


def test_sapo_soft_gate_values_and_gradients():
    # r = 1: gate sigmoid(0) * 4 / tau = 2 / tau; slope 4 sigmoid (1 - sigmoid) = 1, so d loss / d lp = -A r = -A
    # A = 1 (tau_pos = 1): -2; A = -1 (tau_neg = 1.05): 2 / 1.05 = 1.904762
    loss, grad, m = run("sapo", [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, -1.0]])
    assert loss[0].tolist() == pytest.approx([-2.0, 2 / 1.05]) and grad[0].tolist() == pytest.approx([-1.0, 1.0])
    # r = 2, A = 1: gate = 4 sigmoid(1) = 2.924234; gradient -4 sigmoid(1) (1 - sigmoid(1)) * r = -1.572895
    loss, grad, m = run("sapo", [[math.log(2.0)]], [[0.0]], [[1.0]])
    assert loss.item() == pytest.approx(-2.924234, abs=1e-6) and grad.item() == pytest.approx(-1.572895, abs=1e-6)
    assert m["clip_frac"] == 0


def test_unknown_names_and_options_fail_clearly():
    x, mask = torch.zeros(1, 1), ONE
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo'; available: \['chunk_gspo', 'chunk_gspo@gcpo', 'cispo', 'dppo', 'gpg', "
                       r"'grpo_guard', 'gspo', 'sapo'"):
        losses.policy_loss("ppo", x, x, x, mask)
    with pytest.raises(ValueError, match="'gpg' has no option 'clip_low'; its options: \\[\\]"):
        losses.policy_loss("gpg", x, x, x, mask, clip_low=0.2)
    with pytest.raises(ValueError, match=r"dual_clip=0.5 must be null \(off\) or a number > 1"):
        losses.check_policy_loss("vanilla", dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low='a' must be a number in"):
        losses.check_policy_loss("vanilla", clip_low="a")
    with pytest.raises(ValueError, match="must share one"):
        losses.policy_loss("vanilla", x, torch.zeros(1, 2), x, mask)
    assert losses.available_policy_losses() == ["chunk_gspo", "chunk_gspo@gcpo", "cispo", "dppo", "gpg", "grpo_guard",
                                                "gspo", "sapo", "vanilla", "vanilla@tree_rpo"]


def test_a_preset_names_a_methods_clip_and_its_bounds_scale_with_the_clip_range():
    # vanilla@tree_rpo: eps(A) = clamp(eps (1 + |A|), eps / 2, 3 eps); A = 4, eps = 0.1: 0.5 clamped to 0.3, so a
    # ratio of 1.5 is clipped to 1.3 and the loss is -4 * 1.3; the same with absolute bounds [0.05, 0.3]
    name, options = losses.resolve_policy_loss("vanilla@tree_rpo", clip_low=0.1)
    assert name == "vanilla" and options["clip_bounds_scale"] == (0.5, 3.0)
    ratio, adv, mask = torch.tensor([[1.5]]).log(), torch.full((1, 1), 4.0), ONE
    loss, _ = losses.policy_loss(name, ratio, torch.zeros(1, 1), adv, mask, **options)
    assert loss.item() == pytest.approx(-4 * 1.3)
    absolute, _ = losses.policy_loss("vanilla", ratio, torch.zeros(1, 1), adv, mask, clip_low=0.1, clip_eta=1.0,
                                     clip_bounds=(0.05, 0.3))
    assert absolute.item() == pytest.approx(loss.item())
    with pytest.raises(ValueError, match="clip_bounds_scale=.* must be null or"):
        losses.resolve_policy_loss("vanilla@tree_rpo", clip_bounds_scale=(3.0, 0.5))


def test_reward_conditioned_clip_widens_with_the_advantage_within_its_bounds():
    # Dynamic-TreeRPO's eps(A) = clamp(eps (1 + eta |A|), low, high), eps = clip_low = 0.1, eta = 0.5
    log_prob = torch.tensor([[0.3, 0.3, -0.3]]).log1p()  # r = 1.3, 1.3, 0.7
    advantages = torch.tensor([[1.0, 4.0, -4.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, metrics = losses.policy_loss("vanilla", log_prob, torch.zeros(1, 3), advantages, mask, clip_low=0.1,
                                       clip_eta=0.5,
                                       clip_bounds=[0.05, 0.25])
    # eps: 0.1 * 1.5 = 0.15 -> r clipped to 1.15; 0.1 * 3 = 0.3 -> bound 0.25: 1.25; A < 0: r clipped up to 0.75
    assert torch.allclose(loss, torch.tensor([[-1.15, -4 * 1.25, 4 * 0.75]]), atol=1e-5)
    assert metrics["clip_frac"].item() == 1.0
    fixed, _ = losses.policy_loss("vanilla", log_prob, torch.zeros(1, 3), advantages, mask, clip_low=0.1)
    assert torch.allclose(fixed, torch.tensor([[-1.1, -4 * 1.1, 4 * 0.9]]), atol=1e-5)  # off by default
