"""The PPO update hands a mean-shift loss (``dppo``, ``grpo_guard``) the old means from its replay and each pair's
mean shift, std and dt: two epochs on the bare linear model of ``test_ppo_update`` against a hand oracle."""

import pytest
import torch
from torch import nn

from flowrl.training import PPOUpdate
from tests.training.test_ppo_update import B, LR, SIGMAS, T, run, step_of
from tests.training.test_ppo_update import setup as linear_setup


def oracle_step(model, batch, old_means, loss_name, options):
    """One SGD step on the mean over every pair of the loss written out by hand."""
    b, k = torch.arange(B).repeat_interleave(T), torch.arange(T).repeat(B)
    out = step_of(model, batch.rollout.latents, b, k)
    log_ratio = out.log_prob - batch.rollout.log_probs[b, k]
    a = batch.advantages[b, k]
    msd = (out.mean - old_means[b, k]).square().mean(1)
    s = out.std.reshape(-1)
    if loss_name == "dppo":
        r = log_ratio.exp()
        dropped = (msd / (2 * s**2) >= options["kl_threshold"]) & (((r > 1) & (a > 0)) | ((r < 1) & (a < 0)))
        loss = torch.where(dropped, 0.0, -a * r)
    else:
        r = ((log_ratio + msd / (2 * s**2)) * s).exp()
        eps = options["clip_low"]
        loss = torch.maximum(-a * r, -a * r.clamp(1 - eps, 1 + eps)) / (SIGMAS[k] - SIGMAS[k + 1])
    model.zero_grad()
    loss.mean().backward()
    with torch.no_grad():
        model.weight -= LR * model.weight.grad


@pytest.mark.parametrize("loss_name, options", [("dppo", {"kl_threshold": 1e-4}),
                                                ("grpo_guard", {"clip_low": 0.5})])
@pytest.mark.parametrize("micro_batch_size", [1, 8])
def test_two_epochs_of_a_mean_shift_loss_match_the_hand_oracle(loss_name, options, micro_batch_size):
    model, batch = linear_setup()
    oracle = nn.Linear(model.in_features, model.out_features, bias=False)
    oracle.load_state_dict(model.state_dict())
    b, k = torch.arange(B).repeat_interleave(T), torch.arange(T).repeat(B)
    with torch.no_grad():
        old_means = step_of(oracle, batch.rollout.latents, b, k).mean.view(B, T, -1)
    update = PPOUpdate(loss=loss_name, loss_options=options, num_inner_epochs=2, micro_batch_size=micro_batch_size)
    metrics = run(model, batch, update)
    for _ in range(2):
        oracle_step(oracle, batch, old_means, loss_name, options)
    assert torch.allclose(model.weight, oracle.weight, atol=1e-6)
    if loss_name == "dppo":  # the second epoch left the trust region somewhere and dropped pairs
        assert 0 < metrics["dppo_masked_frac"] < 1
