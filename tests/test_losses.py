"""PPO clip, aggregation and the Gaussian mean KL against hand-computed numbers."""

import math

import pytest
import torch

from flowrl import losses


def test_ppo_clip_flow_grpo_example():
    # A = 1, ratio = 1.00015, eps = 1e-4: max(-1.00015, -1.0001) = -1.0001 (clipped: no gradient)
    log_prob = torch.tensor([[math.log(1.00015)]], requires_grad=True)
    loss, m = losses.vanilla(log_prob, torch.zeros(1, 1), torch.ones(1, 1), clip_low=1e-4)
    assert loss.item() == pytest.approx(-1.0001, abs=1e-7) and m["clip_frac"].item() == 1.0
    loss.sum().backward()
    assert log_prob.grad.item() == 0.0


def test_ppo_unclipped_gradient_is_minus_advantage_times_ratio():
    log_prob = torch.tensor([[0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -3.0]])
    loss, m = losses.vanilla(log_prob, torch.zeros(1, 2), adv, clip_low=0.2)
    loss.sum().backward()
    assert loss.tolist() == [[-2.0, 3.0]] and log_prob.grad.tolist() == [[-2.0, 3.0]]
    assert m["approx_kl"].sum() == 0


def test_negative_advantage_clips_below():
    # A = -1, ratio = 0.5, eps = 0.2: max(0.5, 0.8) = 0.8
    loss, m = losses.vanilla(torch.tensor([[math.log(0.5)]]), torch.zeros(1, 1), -torch.ones(1, 1), 0.2)
    assert loss.item() == pytest.approx(0.8) and m["clip_frac"].item() == 1.0


def test_aggregate_and_kl():
    loss = torch.tensor([[1.0, 2.0], [4.0, 8.0]])
    assert losses.aggregate(loss, torch.tensor([[1, 0], [1, 1]]).bool()).item() == pytest.approx(13 / 3)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        losses.aggregate(loss, torch.ones(2, 2).bool(), "seq-mean")
    # ((1 - 0)^2 + (3 - 0)^2) / 2 / (2 * 1^2) = 2.5
    kl = losses.gaussian_mean_kl(torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2), torch.ones(1, 1))
    assert kl.item() == pytest.approx(2.5)
