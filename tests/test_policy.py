"""The tiny policy adapter on a random-weight model loaded through from_pretrained."""

import pytest
import torch

from flowrl.policies import Conditioning, LoraOptions, TinyFlowPolicy
from flowrl.model_paths import resolve_model


def test_loads_from_a_folder_and_runs_cfg(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()
    cond = policy.encode(["red 3 and blue 7", "green 1 and red 2"])
    assert cond.embeds.shape == (2, 8, 32) and cond.null_pooled.shape == (2, 32)
    z, sigma = torch.randn(2, 3, 16, 16), torch.tensor([0.9, 0.4])
    v_c = policy.velocity(z, sigma, cond, 1.0)
    with torch.no_grad():
        both = policy._forward(torch.cat([z, z]), torch.cat([sigma, sigma]),
                               Conditioning.cat([cond.unconditional(), cond.conditional()]))
    v_u = both[:2]
    assert torch.allclose(policy.velocity(z, sigma, cond, 3.0), v_u + 3.0 * (v_c - v_u), atol=1e-5)
    assert policy.sigmas(10).shape == (11,) and policy.sigmas(10)[-1] == 0 and policy.sigmas(10)[0] == 1
    assert policy.decode(torch.full((1, 3, 2, 2), 3.0)).max() == 1.0


def test_lora_trains_only_adapters_and_reference_disables_them(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    for p in policy.trainable_parameters():  # move the adapters away from their identity init (B = 0)
        p.data.add_(0.05)
    cond = policy.encode(["red 3 and blue 7"])
    z, sigma = torch.randn(1, 3, 16, 16), torch.tensor([0.5])
    with torch.no_grad():
        trained = policy.velocity(z, sigma, cond)
        with policy.reference():
            ref = policy.velocity(z, sigma, cond)
        again = policy.velocity(z, sigma, cond)
    fresh = TinyFlowPolicy(tiny_model_dir, lora=None).load()
    with torch.no_grad():
        base = fresh.velocity(z, sigma, fresh.encode(["red 3 and blue 7"]))
    assert torch.allclose(ref, base, atol=1e-6) and not torch.allclose(trained, ref) and torch.equal(trained, again)


def test_full_finetune_reference_is_a_frozen_copy(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=None).load()
    with pytest.raises(RuntimeError, match="setup_reference"):
        with policy.reference():
            pass
    policy.setup_reference()
    assert all(not p.requires_grad for p in policy.reference_denoiser.parameters())
    first = next(policy.denoiser.parameters())
    first.data.add_(1.0)
    with policy.reference():
        assert not torch.equal(next(policy.denoiser.parameters()), first)
    assert next(policy.denoiser.parameters()) is first


def test_missing_model_paths_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="embedded model 'flowrl/nope' is not shipped"):
        resolve_model("flowrl/nope")
    assert resolve_model("org/model") == "org/model"  # a hub id passes through to from_pretrained
