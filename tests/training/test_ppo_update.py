"""The PPO update as a component: a bare linear velocity model, the real Flow-GRPO SDE step, ``plain_steps`` and SGD,
no LightningModule. Each expected weight is an independent oracle: the vanilla PPO loss written out by hand
(``-A exp(log p - log p_old)`` inside the clip range), differentiated by autograd, stepped by hand."""

import dataclasses

import pytest
import torch
from torch import nn

from flowrl.sampling.rollout import Rollout
from flowrl.sampling.steps import flow_grpo_step
from flowrl.training import PPOUpdate, UpdateBatch, plain_steps

B, T, D, LR = 4, 2, 3, 0.5
SIGMAS = torch.tensor([1.0, 0.6, 0.2])  # [T+1]
NO_CLIP = {"clip_low": 1.0, "clip_high": 10.0}  # the clip range [0, 11] holds every ratio here: the loss is -A r


def setup(seed: int = 0):
    """A velocity model ``v = W z``, a batch of recorded states ``[B, T+1, D]`` with their old log-probs under the
    initial ``W`` (on-policy) and advantages ``[B, T]``."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Linear(D, D, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.randn(D, D, generator=gen) * 0.3)
    latents = torch.randn(B, T + 1, D, generator=gen)
    advantages = torch.randn(B, T, generator=gen)
    with torch.no_grad():
        old = step_of(model, latents, torch.arange(B).repeat_interleave(T), torch.arange(T).repeat(B)).log_prob
    rollout = Rollout(prompts=[""] * B, group_ids=torch.zeros(B).long(), seeds=torch.arange(B), latents=latents,
                      log_probs=old.view(B, T), sigmas=SIGMAS.expand(B, -1), train_mask=torch.ones(B, T).bool())
    batch = UpdateBatch(rollout, advantages, torch.ones(B, T), rollout.train_mask, slice(0, B))
    return model, batch


def step_of(model, latents, b, k):
    z = latents[b, k]
    return flow_grpo_step(z, model(z), SIGMAS[k], SIGMAS[k + 1], z_next=latents[b, k + 1], noise_level=0.7)


def run(model, batch, update: PPOUpdate, max_grad_norm=None, seed=7):
    transition = lambda pairs: step_of(model, batch.rollout.latents, pairs[:, 0], pairs[:, 1])  # noqa: E731
    params = list(model.parameters())
    return update.run(batch, transition, None, plain_steps(params, max_grad_norm), torch.optim.SGD(params, lr=LR),
                      seed=seed)


def hand_gradient(model, batch) -> torch.Tensor:
    """d/dW of the mean over every pair of ``-A exp(log p - log p_old)`` (vanilla PPO inside its clip range)."""
    copy = nn.Linear(D, D, bias=False)
    copy.load_state_dict(model.state_dict())
    b, k = torch.arange(B).repeat_interleave(T), torch.arange(T).repeat(B)
    log_p = step_of(copy, batch.rollout.latents, b, k).log_prob
    loss = -(batch.advantages[b, k] * torch.exp(log_p - batch.rollout.log_probs[b, k])).mean()
    loss.backward()
    return copy.weight.grad


@pytest.mark.parametrize("micro_batch_size", [1, 3, 8])
def test_micro_batches_accumulate_to_the_full_batch_gradient(micro_batch_size):
    model, batch = setup()
    w0, g = model.weight.detach().clone(), hand_gradient(model, batch)
    metrics = run(model, batch, PPOUpdate(loss_options=NO_CLIP, micro_batch_size=micro_batch_size))
    # one minibatch of all 8 pairs, in micro-batches of 1, 3 (3 + 3 + 2) or 8: one SGD step on the mean gradient
    torch.testing.assert_close(model.weight.detach(), w0 - LR * g, rtol=1e-5, atol=1e-6)
    assert metrics["grad_norm"] == pytest.approx(g.norm().item(), rel=1e-5)
    assert metrics["ratio_max_dev"] < 1e-6 and metrics["nonfinite_steps"] == 0.0  # on-policy before the step


def test_the_gradient_norm_is_clipped_before_the_step_and_logged_unclipped():
    model, batch = setup()
    w0, g = model.weight.detach().clone(), hand_gradient(model, batch)
    clip = 0.25 * g.norm().item()
    metrics = run(model, batch, PPOUpdate(loss_options=NO_CLIP), max_grad_norm=clip)
    moved = w0 - model.weight.detach()
    torch.testing.assert_close(moved, LR * g * clip / g.norm(), rtol=1e-4, atol=1e-6)  # direction kept, norm = clip
    assert moved.norm().item() == pytest.approx(LR * clip, rel=1e-4)
    assert metrics["grad_norm"] == pytest.approx(g.norm().item(), rel=1e-5)


def test_two_epochs_are_two_sgd_steps_on_the_ppo_loss_with_the_old_log_probs_kept():
    model, batch = setup()
    hand = nn.Linear(D, D, bias=False)
    hand.load_state_dict(model.state_dict())
    norms = []
    for _ in range(2):  # the second epoch's ratio is off-policy: exp(log p(W1) - log p_old(W0))
        g = hand_gradient(hand, batch)
        norms.append(g.norm().item())
        with torch.no_grad():
            hand.weight -= LR * g
    metrics = run(model, batch, PPOUpdate(loss_options=NO_CLIP, num_inner_epochs=2, micro_batch_size=3))
    torch.testing.assert_close(model.weight.detach(), hand.weight.detach(), rtol=1e-5, atol=1e-6)
    assert metrics["grad_norm"] == pytest.approx(sum(norms) / 2, rel=1e-5)  # the mean over the steps taken
    assert norms[0] != pytest.approx(norms[1], rel=1e-3)  # the second step saw a different gradient


def test_minibatches_split_the_pairs_into_optimizer_steps_each_pair_once_per_epoch():
    model, batch = setup()
    seen = []
    transition = lambda pairs: (seen.append(pairs.clone()),  # noqa: E731
                                step_of(model, batch.rollout.latents, pairs[:, 0], pairs[:, 1]))[1]
    params = list(model.parameters())
    steps = plain_steps(params)
    taken = []
    counted_step = steps.optimizer_step
    steps = dataclasses.replace(steps, optimizer_step=lambda *a, **k: taken.append(1) or counted_step(*a, **k))
    PPOUpdate(loss_options=NO_CLIP, num_minibatches=2, micro_batch_size=2).run(
        batch, transition, None, steps, torch.optim.SGD(params, lr=LR), seed=3)
    assert len(taken) == 2 and [len(p) for p in seen] == [2, 2, 2, 2]  # 2 steps of 4 pairs, micro-batches of 2
    pairs = sorted(map(tuple, torch.cat(seen).tolist()))
    assert pairs == [(b, k) for b in range(B) for k in range(T)]  # every (row, step) once


def test_a_non_finite_loss_skips_the_step_and_counts_it():
    model, batch = setup()
    w0 = model.weight.detach().clone()
    batch.advantages[1, 0] = float("nan")
    metrics = run(model, batch, PPOUpdate(loss_options=NO_CLIP, micro_batch_size=3))
    assert torch.equal(model.weight.detach(), w0)  # skipped: the weights are unchanged
    assert metrics["nonfinite_steps"] == 1.0 and metrics["grad_norm"] != metrics["grad_norm"]  # NaN: no step taken
    assert model.weight.grad is None or not model.weight.grad.any()  # and no gradient is left for the next step


def test_recomputed_log_probs_make_a_stale_batch_on_policy():
    model, batch = setup()
    stale = dataclasses.replace(batch, rollout=dataclasses.replace(batch.rollout,
                                                                   log_probs=batch.rollout.log_probs + 0.05))
    off = run(model, stale, PPOUpdate(loss_options=NO_CLIP), seed=1)
    assert off["ratio_max_dev"] == pytest.approx(1 - torch.exp(torch.tensor(-0.05)).item(), rel=1e-4)  # r = e^-0.05
    model, batch = setup()
    stale = dataclasses.replace(batch, rollout=dataclasses.replace(batch.rollout,
                                                                   log_probs=batch.rollout.log_probs + 0.05))
    w0, g = model.weight.detach().clone(), hand_gradient(model, batch)  # the gradient of the on-policy batch
    on = run(model, stale, PPOUpdate(loss_options=NO_CLIP, recompute_log_probs=True), seed=1)
    assert on["ratio_max_dev"] < 1e-6
    torch.testing.assert_close(model.weight.detach(), w0 - LR * g, rtol=1e-5, atol=1e-6)
