"""Named LoRA adapters on one backbone: each runs under its own context and changes the output its own way, the
reference is the backbone without any, every trained adapter keeps its trainability through the contexts, one
optimizer per adapter trains only that adapter, and export and EMA take an adapter by name."""

import pytest
import torch
from diffusers import StableDiffusion3Pipeline

from flowrl.callbacks.ema import trainable_parameters
from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, SD3Policy, TinyFlowPolicy
from flowrl.policies.export import export_lora
from tests.policies.test_export import PROMPTS, SEEDS, STEPS, pipeline_images


def moved(params, seed):
    torch.manual_seed(seed)
    with torch.no_grad():  # stand-in for training: LoRA B starts at 0, so an untrained adapter changes nothing
        for p in params:
            p.add_(0.2 * torch.randn_like(p))


@pytest.fixture
def policy(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    policy.add_adapter("fake_score", LoraOptions(rank=2, alpha=2))
    policy.add_adapter("frozen_head", LoraOptions(rank=2, alpha=2), trainable=False)
    return policy


def velocity(policy, seed=0):
    z = torch.randn(2, *policy.latent_shape(), generator=torch.Generator().manual_seed(seed))
    cond = policy.encode(["red 1 and blue 2", "green 3 and red 4"])
    with torch.no_grad():
        return policy.velocity(z, torch.full((2,), 0.6), cond, 2.0)


def test_adapters_run_under_their_context_and_the_reference_under_none(policy):
    assert policy.adapter_names == ["default", "fake_score", "frozen_head"] and policy.active_adapter == "default"
    moved(policy.trainable_parameters("default"), 1)
    moved(policy.trainable_parameters("fake_score"), 2)
    main = velocity(policy)
    with policy.adapter("fake_score"):
        fake = velocity(policy)
        assert policy.active_adapter == "fake_score"
    with policy.reference():
        base = velocity(policy)
    with policy.adapter("frozen_head"):  # never trained, B = 0: the backbone's output
        assert torch.equal(velocity(policy), base)
    assert policy.active_adapter == "default" and torch.equal(velocity(policy), main)  # contexts restore
    assert not torch.allclose(main, fake) and not torch.allclose(main, base) and not torch.allclose(fake, base)


def test_each_trained_adapter_keeps_its_parameters_trainable_through_the_contexts(policy):
    names = {name: {id(p) for p in policy.trainable_parameters(name)} for name in policy.adapter_names}
    assert names["default"] and names["fake_score"] and not names["frozen_head"]
    assert not names["default"] & names["fake_score"]
    everything = {id(p) for p in policy.trainable_parameters()}
    assert everything == names["default"] | names["fake_score"]  # the backbone and the text encoder stay frozen
    with policy.adapter("fake_score"), policy.reference():
        pass
    assert {id(p) for p in policy.trainable_parameters()} == everything
    with pytest.raises(ValueError, match="no adapter 'nope'.*'default', 'fake_score', 'frozen_head'"):
        policy.trainable_parameters("nope")
    with pytest.raises(ValueError, match="already has an adapter named 'fake_score'"):
        policy.add_adapter("fake_score", LoraOptions())


def test_one_optimizer_per_adapter_trains_only_its_adapter(policy):
    moved(policy.trainable_parameters("default"), 1)
    optimizers = {name: torch.optim.SGD(policy.trainable_parameters(name), lr=0.1) for name in ("default", "fake_score")}
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    z = torch.randn(2, *policy.latent_shape())
    cond = policy.encode(["red 1 and blue 2", "green 3 and red 4"])
    with policy.adapter("fake_score"):
        policy.velocity(z, torch.full((2,), 0.6), cond, 1.0).square().mean().backward()
    optimizers["fake_score"].step()
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".fake_score." in n for n in changed)


def test_ema_averages_the_named_adapter_only(policy):
    module = FlowGRPO(policy, num_steps=2)
    only = trainable_parameters(module, "fake_score")
    assert only and all(".fake_score." in name for name, _ in only)
    assert {id(p) for _, p in only} == {id(p) for p in policy.trainable_parameters("fake_score")}


def test_export_writes_the_named_adapter_and_refuses_to_guess(sd3_dir, tmp_path):
    policy = SD3Policy(sd3_dir, lora=LoraOptions(rank=4, alpha=8), resolution=32, max_sequence_length=8).load()
    policy.add_adapter("other", LoraOptions(rank=2, alpha=4))
    moved(policy.trainable_parameters("default"), 1)
    moved(policy.trainable_parameters("other"), 2)
    with pytest.raises(ValueError, match=r"trains the adapters \['default', 'other'\]: name the one to export"):
        export_lora(policy, tmp_path / "guess")
    with policy.adapter("other"):
        ours = FlowGRPO(policy, guidance_scale=3.0).generation.generate(PROMPTS, SEEDS, STEPS)
    export_lora(policy, tmp_path / "other", adapter="other")
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.load_lora_weights(tmp_path / "other")
    torch.testing.assert_close(pipeline_images("sd3", pipe, policy), ours, atol=1e-5, rtol=1e-4)


def test_an_adapter_starts_from_saved_weights(policy, tiny_model_dir, tmp_path):
    from flowrl.policies.adapter_weights import save_adapter

    moved(policy.trainable_parameters("fake_score"), 3)
    save_adapter(policy, "fake_score", tmp_path)
    again = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=2, alpha=2, init=str(tmp_path))).load()
    saved = {n: p for n, p in policy.denoiser.named_parameters() if ".fake_score." in n}
    loaded = {n.replace(".default.", ".fake_score."): p for n, p in again.denoiser.named_parameters() if ".default." in n}
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[n], loaded[n]) for n in saved)
