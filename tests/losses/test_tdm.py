"""TDM-R1's losses against hand-computed values (the worked examples of issue 14 and shared/reference section 6)."""

import math

import pytest
import torch

from flowrl.losses.tdm import (fake_score_loss, frozen_rows, generator_loss, group_logits, group_preference_loss,
                               renoise, renoise_sigma, shift_time, surrogate_target, unshift_time)

A = torch.tensor([1.0, -1.0, 0.5, -0.5])
DSM = torch.tensor([0.50, 0.70, 0.60, 0.65])
REF = torch.full((4,), 0.60)


def test_group_preference_worked_example():
    # terms A beta_dpo (dsm - ref) / G: 1(-0.1)/4 = -0.025, -1(0.1)/4 = -0.025, 0.5(0)/4 = 0, -0.5(0.05)/4 = -0.00625
    s = group_logits(DSM - REF, A, torch.zeros(4, dtype=torch.long), beta_dpo=1.0)
    assert s.tolist() == pytest.approx([-0.05625] * 4)
    w = torch.sigmoid(s)  # 1 / (1 + e^0.05625) = 0.485941
    assert w[0].item() == pytest.approx(0.485941, abs=1e-6)
    # mean(w A dsm) = 0.485941 (0.5 - 0.7 + 0.3 - 0.325) / 4 = 0.485941 * -0.05625 = -0.027334
    assert group_preference_loss(DSM, A, w).item() == pytest.approx(-0.027334, abs=1e-6)
    # the paper's value of the same logit: softplus(s_g) = log(1 + e^-0.05625) = 0.665418
    assert torch.nn.functional.softplus(s[0]).item() == pytest.approx(0.665418, abs=1e-6)


def test_group_preference_gradient_is_the_softplus_gradient():
    # d softplus(s_g) / d dsm_i = sigmoid(s_g) A_i beta / G; the coded loss is a mean over B = G rows: the same / G ...
    dsm = DSM.clone().requires_grad_()
    s = group_logits(dsm - REF, A, torch.zeros(4, dtype=torch.long), 1.0)
    group_preference_loss(dsm, A, torch.sigmoid(s)).backward()
    assert torch.allclose(dsm.grad, torch.sigmoid(s) * A / 4)
    # ... and only through dsm: the logit and its weight are constants (the code detaches both)
    assert s.grad_fn is None or not s.requires_grad


def test_group_logits_are_per_group_and_frozen_rows_carry_no_gradient():
    # two groups of two: group 0 (A 1, -1; delta -0.2, 0.2) -> (-0.2 - 0.2) / 2 = -0.2; group 1 (A 2, 0) -> 2(0.1)/2
    s = group_logits(torch.tensor([-0.2, 0.2, 0.1, 0.3]), torch.tensor([1.0, -1.0, 2.0, 0.0]),
                     torch.tensor([7, 7, 3, 3]), 1.0)
    assert s.tolist() == pytest.approx([-0.2, -0.2, 0.1, 0.1])
    dsm = torch.tensor([0.5, 0.5]).requires_grad_()
    frozen = torch.tensor([True, False])
    group_preference_loss(dsm, torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5]), frozen).backward()
    assert dsm.grad.tolist() == [0.0, 0.25]  # 0.5 * 1 / 2 for the free row


def test_frozen_rows_by_ratio_and_by_drift():
    dsm, old, ref = torch.tensor([0.5, 0.5, 0.5, 0.5]), torch.tensor([0.5005, 0.4985, 0.51, 0.49]), REF
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    # ratio exp(old - dsm): e^0.0005 = 1.0005 < 1.001 (A > 0: free); e^-0.0015 = 0.9985 < 0.999 (A < 0: frozen);
    # e^0.01 > 1.001 (frozen); e^-0.01 < 0.999 (frozen)
    assert frozen_rows(dsm, old, ref, adv, 1e-3, torch.tensor(0.0), 0.05).tolist() == [False, True, True, True]
    # drift above the threshold: rows already better than the reference in their direction freeze too
    # (ref - dsm = 0.1 > 0: ref_ratio > 1, which A > 0 wants: row 0 freezes; A < 0 wants < 1: row 1 stays)
    old_same = dsm.clone()
    assert frozen_rows(dsm, old_same, ref, adv, 1e-3, torch.tensor(0.06), 0.05).tolist() == [True, False, True, False]
    assert frozen_rows(dsm, old_same, ref, adv, 1e-3, torch.tensor(0.04), 0.05).tolist() == [False] * 4


def test_generator_target_worked_example():
    t = lambda v: torch.tensor([[v]])  # noqa: E731
    # w = |0 - 0.55| = 0.55; L_cfg = (3.5 * 0.1)^2 / 0.55 = 0.222727; L_kl = (0.2 - 0.15)^2 / 0.55 = 0.004545;
    # w_r = |0 - 0.3| = 0.3, L_r = (0.3 - 0.25)^2 / 0.3 = 0.008333
    loss, parts = generator_loss(t(0.0), t(0.2), t(0.1), t(0.15), 4.5, 0.3, t(0.3), t(0.25))
    assert [parts[k].item() for k in ("cfg", "kl", "reward")] == pytest.approx([0.222727, 0.004545, 0.008333], abs=1e-6)
    assert loss.item() == pytest.approx(0.3 * 0.222727 + 0.7 * 0.008333 + 0.004545, abs=1e-6)  # 0.077197
    assert loss.item() == pytest.approx(0.077197, abs=1e-6)
    truncated, _ = generator_loss(t(0.0), t(0.2), t(0.1), t(0.15), 4.5, 0.3)
    assert truncated.item() == pytest.approx(0.3 * (0.222727 + 0.004545), abs=1e-6)  # 0.068182
    assert truncated.item() == pytest.approx(0.068182, abs=1e-6)


def test_generator_loss_moves_x0_toward_the_targets():
    x0 = torch.zeros(1, 1, requires_grad=True)
    loss, _ = generator_loss(x0, torch.tensor([[0.2]]), torch.tensor([[0.1]]), torch.tensor([[0.15]]), 4.5, 0.3,
                             torch.tensor([[0.3]]), torch.tensor([[0.25]]))
    loss.backward()
    # d/dx0 of sum c (target - x0)^2 / w with detached targets: -2 (0.3 * 0.35 / 0.55 + 0.7 * 0.05 / 0.3 + 0.05 / 0.55)
    assert x0.grad.item() == pytest.approx(-2 * (0.3 * 0.35 / 0.55 + 0.7 * 0.05 / 0.3 + 0.05 / 0.55), rel=1e-5)


def test_renoising_levels_and_the_forward_process():
    assert shift_time(torch.tensor(0.5), 3.0).item() == pytest.approx(0.75)
    assert unshift_time(shift_time(torch.tensor([0.1, 0.7]), 3.0), 3.0).tolist() == pytest.approx([0.1, 0.7])
    # lower 0.6 at shift 3: unshift 0.6 / (3 - 1.2) = 1/3, + 0.02; u = 0 -> shift(0.353333) = 1.06 / 1.706667 = 0.621094
    assert renoise_sigma(torch.tensor([0.6]), torch.tensor([0.0]), 3.0).item() == pytest.approx(0.621094, abs=1e-6)
    assert renoise_sigma(torch.tensor([0.6]), torch.tensor([1.0]), 3.0).item() == pytest.approx(1.0)
    # z_sigma = (1 - s) x0 + s e has the marginal of level tau after renoise: a (1 - s) = 1 - tau and
    # a^2 s^2 + b^2 = tau^2
    _, a, b = renoise(torch.zeros(1, 1), torch.tensor([0.3]), torch.tensor([0.8]), torch.zeros(1, 1))
    assert (a * 0.7).item() == pytest.approx(0.2) and (a**2 * 0.09 + b**2).item() == pytest.approx(0.64)


def test_surrogate_target_is_the_velocity_of_a_clean_sample_and_the_code_formula_otherwise():
    z, e = torch.tensor([[0.4]]), torch.tensor([[-1.0]])
    assert surrogate_target(z, torch.tensor([0.0]), torch.tensor([0.5]), e).item() == pytest.approx(-1.4)  # e - x0
    # sigma 0.2, tau 0.6: a = 0.4 / 0.8 = 0.5, b = sqrt(0.36 - 0.01) = 0.591608;
    # -0.4 / 0.8 + (-1 / 0.591608)(0.6 + 0.04 * 0.5 / 0.8) = -0.5 - 1.690309 * 0.625 = -1.556443
    value = surrogate_target(z, torch.tensor([0.2]), torch.tensor([0.6]), e).item()
    assert value == pytest.approx(-0.5 - 0.625 / math.sqrt(0.35), abs=1e-6)


def test_fake_score_loss_by_hand():
    # per row: mean((1 - 0)^2, (3 - 1)^2) = 2.5; + 0.02 mean((0 - 0)^2, (2 - 1)^2) = 0.01
    loss = fake_score_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 2.0]]))
    assert loss.item() == pytest.approx(2.51)
