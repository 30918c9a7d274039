"""DiffusionNFT on named adapters: one training step against a hand-built recomputation of its loss, the old policy's
soft update by hand, option errors before any weight loads, a 2-step CLI fit of configs/tiny_diffusion_nft.yaml, exact
resume from a checkpoint holding both adapters, the policy's LoRA exported for the plain diffusers pipeline (2 processes
against 1: tests/methods/test_two_ranks_equal_one.py). The loss's worked examples are in tests/losses/test_nft.py."""

import pytest
import torch

from flowrl.cli import main
from flowrl.losses.nft import nft_loss
from flowrl.methods import DiffusionNFT
from flowrl.training.adapter_steps import follow
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.policies.base import adapter_of
from flowrl.sampling.sampler import branch_seed, seeded_noise
from tests.cli.test_fit import load_steps
from tests.methods.likelihood_free import (ROOT, assert_export_matches_pipeline, assert_resume_is_exact, option_errors,
                                           shrunk)
from tests.methods.test_method_layer import method_help


def adapter_params(policy, name):
    return [p for n, p in policy.denoiser.named_parameters() if adapter_of(n) == name]


@pytest.fixture
def method(tiny_model_dir):
    return DiffusionNFT(TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)), num_steps=3).load_weights()


def test_old_adapter_starts_as_a_copy_and_follows_by_hand(method):
    policy = method.policy
    assert policy.adapter_names == ["default", "old"] and not policy.trainable_parameters("old")
    assert all(torch.equal(o, p) for o, p in zip(adapter_params(policy, "old"), adapter_params(policy, "default")))
    with torch.no_grad():
        for p in adapter_params(policy, "default"):
            p.fill_(2.0)
        for p in adapter_params(policy, "old"):
            p.fill_(4.0)
    follow(policy, "old", "default", 0.25)  # old <- 0.25 * 4 + 0.75 * 2 = 2.5
    assert all(torch.allclose(p, torch.full_like(p, 2.5)) for p in adapter_params(policy, "old"))


def test_pair_loss_is_the_nft_loss_on_seeded_forward_noise(method):
    # the method's loss of two (sample, level) pairs equals the pure loss on x_t = (1 - t) x0 + t eps built here, with
    # eps from (row seed, seed, step, 1, level) and the reference term beta mean((v - v_ref)^2)
    policy, method.beta = method.policy, 0.5
    torch.manual_seed(0)
    with torch.no_grad():
        for p in adapter_params(policy, "default"):
            p.add_(0.1 * torch.randn_like(p))  # the policy moved away from old and the reference
    x0 = torch.randn(2, *policy.latent_shape())
    t, r, seeds, levels = torch.tensor([0.8, 0.3]), torch.tensor([0.9, 0.2]), torch.tensor([5, 6]), torch.tensor([0, 2])
    cond = policy.encode(["red 1 and blue 2", "green 3 and red 4"])
    got = method.pair_loss(x0, t, r, cond, seeds, levels)
    eps = seeded_noise(torch.tensor([branch_seed(5, [0, 0, 1, 0]), branch_seed(6, [0, 0, 1, 2])]),
                       policy.latent_shape(), 1)[:, 0]
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    with torch.no_grad():
        v = policy.velocity(x_t, t, cond, 1.0)
        with policy.adapter("old"):
            v_old = policy.velocity(x_t, t, cond, 1.0)
        with policy.reference():
            v_ref = policy.velocity(x_t, t, cond, 1.0)
    assert torch.equal(v_old, v_ref)  # old is still the initial copy: LoRA B = 0
    want = nft_loss(v, v_old, x_t, x0, t, r, 1.0, 5.0) + 0.5 * (v - v_ref).square().flatten(1).mean(1)
    torch.testing.assert_close(got.detach(), want)


def test_option_errors_come_before_any_weight_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    err = option_errors("tiny_diffusion_nft.yaml", tmp_path, "--model.init_args.nft_beta=0",
                        "--model.init_args.advantage_mode=both", "--model.init_args.step_kind=ddim",
                        "--model.init_args.timestep_fraction=0", "--model.init_args.old_decay.limit=1.5",
                        "--model.init_args.advantage=grpo@nope")
    for key in ("model.nft_beta=0", "model.advantage_mode='both'", "model.step_kind='ddim'",
                "model.timestep_fraction=0", "limit", "model.advantage", f"{tmp_path}/no"):
        assert key in err, key
    with pytest.raises(ValueError, match="nft_beta=-1"):
        DiffusionNFT(None, nft_beta=-1)


def test_help_shows_nft_options_and_no_ppo_options(capsys):
    options = method_help("flowrl.methods.DiffusionNFT", capsys)
    assert {"nft_beta", "advantage_mode", "old_decay.delay", "timestep_fraction", "num_minibatches"} <= set(options)
    assert not {"clip_range", "loss", "loss_options", "check_ratio", "recompute_log_probs"} & set(options)
    assert not [n for n, text in options.items() if text.startswith(("(type:", "(required"))]


def test_the_tiny_config_fits_two_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(shrunk("tiny_diffusion_nft.yaml", tmp_path))
    steps = load_steps(tmp_path)
    assert sorted(steps) == ["step0_rank0", "step1_rank0"]
    weights = torch.load(tmp_path / "dump/weights.pt")
    default = {k: w for k, w in weights.items() if "lora_B.default." in k}
    old = {k.replace(".old.", ".default."): w for k, w in weights.items() if "lora_B.old." in k}
    assert any(w.abs().sum() > 0 for w in default.values())  # trained (LoRA B starts at 0)
    assert any(w.abs().sum() > 0 for w in old.values())  # old followed it (decay 0.001 n after step n)


def test_resume_is_exact_and_the_checkpoint_holds_both_adapters(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = lambda out, *extra: shrunk("tiny_diffusion_nft.yaml", out, "--model.init_args.num_minibatches=2",  # noqa
                                      "--model.init_args.micro_batch_size=5", *extra, model_dir=tiny_model_dir)
    checkpoint = assert_resume_is_exact(args, tmp_path, ("default", "old"))
    assert checkpoint["global_step"] == 2  # 2 minibatches per batch: one batch


def test_exported_policy_lora_loads_in_the_diffusers_pipeline(sd3_dir, tmp_path):
    # both adapters are in the checkpoint; the export writes the trained one (default), not the old copy
    assert_export_matches_pipeline(tmp_path, sd3_dir, "flowrl.methods.DiffusionNFT", "    guidance_scale: 1.0",
                                   ["default", "old"])
