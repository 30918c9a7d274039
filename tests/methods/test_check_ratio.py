"""The on-policy check (``check_ratio``): recomputed log-probs with unchanged weights against the sampled ones."""

import math

import pytest
import torch

from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.training.ppo_update import UpdateBatch


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()
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


def deviation(loop, rollout, cond, epoch) -> float:
    """The update's on-policy check of ``rollout`` in the micro-batches ``epoch`` (no advantage, unit weights)."""
    zeros, ones = torch.zeros_like(rollout.log_probs), torch.ones_like(rollout.log_probs)
    batch = UpdateBatch(rollout, zeros, ones, rollout.train_mask, slice(0, rollout.batch_size))
    return loop.ppo.on_policy_ratio_deviation(batch, lambda pairs: loop.transition(rollout, cond, pairs), None, epoch)


def test_unchanged_weights_give_ratio_one(setup):
    loop, rollout, cond, epoch = setup
    # sampled as one batch of 4 with CFG (8 rows), recomputed in micro-batches of 3 pairs of mixed steps
    assert max(len(c) for m in epoch for c in m) == 3
    assert deviation(loop, rollout, cond, epoch) < 1e-5


def test_a_log_prob_mismatch_is_measured_and_warned(setup):
    loop, rollout, cond, epoch = setup
    shifted = type(rollout)(**{**rollout.__dict__, "log_probs": rollout.log_probs - 0.01})
    with pytest.warns(UserWarning, match="check_ratio: max \\|ratio - 1\\|"):
        measured = deviation(loop, shifted, cond, epoch)
    # ratio = exp(new - old) = exp(0.01) on every pair: deviation e^0.01 - 1 = 0.0100502
    assert measured == pytest.approx(math.exp(0.01) - 1, abs=1e-5)
