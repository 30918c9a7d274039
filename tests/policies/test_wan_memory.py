"""What the Wan memory options keep and what they must not change: full fine-tuning of one Wan 2.2 expert copies
only that expert as the KL reference (the frozen one is its own), with the reference velocities of a copy of the
whole denoiser; a frame-chunked training pass would change the model (Wan attends over every frame at once), while a
row-chunked one does not; a tiled VAE decodes the same video up to its tile blending."""

import copy

import pytest
import torch

from tests.policies.test_wan import PROMPTS, wan


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_full_finetuning_of_one_expert_copies_only_that_expert_as_the_reference(wan_dirs):
    policy = wan(wan_dirs["wan22"], lora=None, trained_experts=["transformer"])
    with pytest.raises(RuntimeError, match="setup_reference"):
        with policy.reference():
            pass
    whole = copy.deepcopy(policy.denoiser)  # what the reference was before: a copy of both experts
    before, checkpointed = numel(policy), set(policy.state_dict())
    policy.setup_reference()
    copies = {n for n, _ in policy.named_parameters() if ".reference_experts." in n}
    assert copies == {f"denoiser.reference_experts.transformer.{n}"
                      for n, _ in policy.denoiser.transformer.named_parameters()}
    assert numel(policy) - before == numel(policy.denoiser.transformer)  # one expert's weights, not two
    assert set(policy.state_dict()) == checkpointed  # the copy reloads from the model path, as before
    with torch.no_grad():  # a training step's stand-in: move the trained expert
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    cond, z, sigma = policy.encode(PROMPTS), torch.randn(2, *policy.latent_shape()), policy.sigmas(6)[[0, 5]]
    assert policy.denoiser.expert_index(policy.timesteps(sigma)).tolist() == [0, 1]  # a row on each expert
    with torch.no_grad():
        trained = policy.velocity(z, sigma, cond, 3.0)
        with policy.reference():
            reference = policy.velocity(z, sigma, cond, 3.0)
        policy.denoiser = whole
        want = policy.velocity(z, sigma, cond, 3.0)
    assert (trained[0] - want[0]).abs().max() > 1e-3 and torch.equal(trained[1], want[1])  # the frozen expert's row
    torch.testing.assert_close(reference, want, atol=0, rtol=0)


def test_full_finetuning_of_both_experts_copies_both(wan_dirs):
    policy = wan(wan_dirs["wan22"], lora=None)
    policy.setup_reference()
    assert list(policy.denoiser.reference_experts) == ["transformer", "transformer_2"]
    assert not any(p.requires_grad for p in policy.denoiser.reference_experts.parameters())
