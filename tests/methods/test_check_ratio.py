"""The on-policy check (``check_ratio``): recomputed log-probs with unchanged weights against the sampled ones."""

import math

import pytest
import torch

from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, TinyFlowPolicy


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4))
    loop = FlowGRPO(policy, num_steps=4, guidance_scale=2.0, micro_batch_size=3, check_ratio=True)
    batch = {"prompts": ["red 1 and blue 2"] * 2 + ["green 3 and red 4"] * 2,
             "group_ids": torch.tensor([0, 0, 1, 1]), "seeds": torch.tensor([5, 6, 7, 8])}
    policy.eval()
    with torch.no_grad():
        cond = policy.encode(batch["prompts"])
        rollout = loop.rollout(batch, cond)
    policy.train()
    pairs = rollout.train_mask.nonzero()
    epoch = loop.ppo.micro_batches(pairs, torch.Generator().manual_seed(0))
    return loop, rollout, cond, epoch


def test_unchanged_weights_give_ratio_one(setup):
    loop, rollout, cond, epoch = setup
    zeros, ones = torch.zeros_like(rollout.log_probs), torch.ones_like(rollout.log_probs)
    # sampled as one batch of 4 with CFG (8 rows), recomputed in micro-batches of 3 pairs of mixed steps
    assert max(len(c) for m in epoch for c in m) == 3
    assert loop.ppo.on_policy_ratio_deviation(loop, rollout, cond, zeros, ones, epoch) < 1e-5


def test_a_log_prob_mismatch_is_measured_and_warned(setup):
    loop, rollout, cond, epoch = setup
    shifted = type(rollout)(**{**rollout.__dict__, "log_probs": rollout.log_probs - 0.01})
    zeros, ones = torch.zeros_like(rollout.log_probs), torch.ones_like(rollout.log_probs)
    with pytest.warns(UserWarning, match="check_ratio: max \\|ratio - 1\\|"):
        deviation = loop.ppo.on_policy_ratio_deviation(loop, shifted, cond, zeros, ones, epoch)
    # ratio = exp(new - old) = exp(0.01) on every pair: deviation e^0.01 - 1 = 0.0100502
    assert deviation == pytest.approx(math.exp(0.01) - 1, abs=1e-5)
