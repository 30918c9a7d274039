"""The loop's policy-loss wiring: option checks before weights load, whole-sample micro-batches for sequence-level
losses, and the [R, T] layout that gives GSPO each sample's geometric-mean ratio."""

import math

import pytest
import torch

from flowrl.methods import FlowGRPO
from tests.methods.likelihood_free import ROOT, assert_resume_is_exact, shrunk
from tests.methods.options import option_problems
from flowrl.policies import LoraOptions, TinyFlowPolicy


def test_loss_options_are_checked_with_the_key_named():
    assert option_problems(FlowGRPO, loss="gpg", clip_range=0.2) == []  # gpg has no clip: clip_range is not passed to it
    assert option_problems(FlowGRPO, loss="vanilla", loss_options={"clip_high": 0.28, "dual_clip": 3.0}) == []
    [problem] = option_problems(FlowGRPO, loss="ppo2")
    assert problem.startswith("model.loss='ppo2': choose a policy loss from ['chunk_gspo', 'chunk_gspo@gcpo', 'cispo', "
                              "'dppo', 'gpg', 'grpo_guard', 'gspo'")
    [problem] = option_problems(FlowGRPO, loss="vanilla", loss_options={"clip_hihg": 0.28})
    assert problem.startswith("model.loss_options: policy loss 'vanilla' has no option 'clip_hihg'")
    [problem] = option_problems(FlowGRPO, loss="sapo", loss_options={"tau_neg": 0})
    assert "tau_neg=0 must be a number > 0" in problem


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()


def test_bad_loss_fails_at_construction(policy):
    with pytest.raises(ValueError, match="model.loss='nope'"):
        FlowGRPO(policy, loss="nope")


def test_sequence_level_micro_batches_keep_samples_whole(policy):
    train = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 1, 0], [1, 1, 1], [1, 1, 0]]).bool()  # holes, uneven rows
    pairs = train.nonzero()
    for loss in ("gspo", "vanilla"):
        loop = FlowGRPO(policy, num_steps=3, loss=loss, micro_batch_size=4, num_minibatches=2)
        minibatches = loop.ppo.micro_batches(pairs, torch.Generator().manual_seed(0))
        assert len(minibatches) == 2
        flat = torch.cat([chunk for minibatch in minibatches for chunk in minibatch])
        assert sorted(map(tuple, flat.tolist())) == sorted(map(tuple, pairs.tolist()))  # every pair exactly once
        for chunk in (chunk for minibatch in minibatches for chunk in minibatch):
            samples = chunk[:, 0].unique()
            if loss == "gspo":  # all of a sample's trained steps, within the size unless one sample exceeds it
                assert all((chunk[:, 0] == s).sum() == train[s].sum() for s in samples)
                assert len(chunk) <= 4 or len(samples) == 1
            else:
                assert len(chunk) <= 4


def test_gspo_pair_loss_sees_each_samples_geometric_mean_ratio(policy):
    torch.manual_seed(0)
    loop = FlowGRPO(policy, num_steps=3, timestep_fraction=1.0, guidance_scale=1.0, clip_range=0.5, loss="gspo")
    batch = {"prompts": ["red 1 and blue 2"] * 2, "group_ids": torch.zeros(2, dtype=torch.long),
             "seeds": torch.tensor([5, 6])}
    with torch.no_grad():
        cond = policy.encode(batch["prompts"])
        rollout = loop.rollout(batch, cond)
    assert rollout.train_mask.all()
    rollout.log_probs[:, 2] -= 0.3  # log r = (0, 0, 0.3) at the three steps of both samples
    advantages, weights = torch.ones(2, 3), torch.ones(2, 3)
    pairs = rollout.train_mask.nonzero()
    loss, metrics = loop.pair_loss(rollout, cond, advantages, weights, pairs)
    # s = exp(mean(0, 0, 0.3)) = exp(0.1) = 1.105171 at every pair; loss = mean(-A s) (inside the 0.5 clip)
    assert metrics["ratio_min"] == pytest.approx(math.exp(0.1), abs=1e-4)
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.1), abs=1e-4)
    assert loss.item() == pytest.approx(-math.exp(0.1), abs=1e-4)
    # per position (vanilla) the same pairs have ratios 1, 1, exp(0.3): loss -(1 + 1 + 1.349859) / 3
    loop.ppo.loss, loop.ppo.loss_options = "vanilla", {"clip_low": 0.5}
    loss, metrics = loop.pair_loss(rollout, cond, advantages, weights, pairs)
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.3), abs=1e-4)
    assert loss.item() == pytest.approx(-(2 + math.exp(0.3)) / 3, abs=1e-4)


def test_the_kl_convention_scales_each_steps_kl_by_its_dt(tiny_model_dir):
    """flow_grpo's KL (over 2 s^2) is the exact transition KL (over 2 s^2 |dt|) times |dt|, step by step."""
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()
    for p in policy.trainable_parameters():  # away from the reference (LoRA B = 0 is the reference exactly)
        p.data.add_(0.05)
    batch = {"prompts": ["red 1 and blue 2"] * 2, "group_ids": torch.zeros(2, dtype=torch.long),
             "seeds": torch.tensor([5, 6])}
    kls = {}
    for convention in ("exact", "flow_grpo"):
        loop = FlowGRPO(policy, num_steps=3, timestep_fraction=1.0, guidance_scale=1.0, beta=0.5,
                        kl_convention=convention)
        with torch.no_grad():
            cond = policy.encode(batch["prompts"])
            rollout = loop.rollout(batch, cond)
            ones = torch.ones_like(rollout.log_probs)
            kls[convention] = [loop.pair_loss(rollout, cond, ones, ones, torch.tensor([[0, k], [1, k]]))[1]["kl"]
                               for k in range(3)]
    dt = (rollout.sigmas[0, :-1] - rollout.sigmas[0, 1:]).tolist()
    assert all(k > 0 for k in kls["exact"])
    for exact, scaled, step in zip(kls["exact"], kls["flow_grpo"], dt):
        assert scaled == pytest.approx(exact * step, rel=1e-5)


@pytest.mark.parametrize("config", ["tiny_dppo.yaml", "tiny_grpo_guard.yaml"])
def test_the_mean_shift_losses_resume_exactly(config, tiny_model_dir, tmp_path, monkeypatch):
    """Flow-DPPO and GRPO-Guard (the old means a batch replays before its first minibatch, read by the loss of its
    second): 4 straight optimizer steps equal 2 steps, a checkpoint and 2 resumed ones."""
    monkeypatch.chdir(ROOT)
    args = lambda out, *extra: shrunk(config, out, "--model.init_args.num_minibatches=2",  # noqa: E731
                                      "--model.init_args.micro_batch_size=5", *extra, model_dir=tiny_model_dir)
    assert assert_resume_is_exact(args, tmp_path, ("default",))["global_step"] == 2
