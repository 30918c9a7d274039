"""What the Wan memory options keep and what they must not change: full fine-tuning of one Wan 2.2 expert copies
only that expert as the KL reference (the frozen one is its own), with the reference velocities of a copy of the
whole denoiser; a frame-chunked training pass would change the model (Wan attends over every frame at once), while a
row-chunked one does not; ``vae_tiling`` decodes in tiles exactly as the pipeline with tiling does."""

import copy

import pytest
import torch
from diffusers import WanPipeline

from tests.policies.test_wan import PROMPTS, ode_sample, pipe_call, wan


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


def test_a_frame_chunked_pass_changes_the_velocity_and_a_row_chunked_one_does_not(wan_dirs):
    policy = wan(wan_dirs["wan21"], num_frames=17)
    cond, sigma = policy.encode(PROMPTS), policy.sigmas(4)[[1, 2]]
    z = torch.randn(2, *policy.latent_shape())  # 5 latent frames of 2 x 2 tokens
    with torch.no_grad():
        full = policy.velocity(z, sigma, cond, 4.0)
        rows = torch.cat([policy.velocity(z[i:i + 1], sigma[i:i + 1], cond.select([i]), 4.0) for i in range(2)])
        frames = torch.cat([policy.velocity(z[:, :, f:f + 1], sigma, cond, 4.0) for f in range(z.shape[2])], 2)
    torch.testing.assert_close(rows, full, atol=1e-5, rtol=1e-5)  # micro-batches of rows: the same function
    # a frame alone attends to its own tokens only: every frame's velocity moves by a share of the velocity's scale
    # far above float noise (about 10% on the tests' tiny model), the first frame's too, whose rotary positions are
    # the same in both passes, so the change is the attention across frames
    per_frame = (frames - full).abs().amax(dim=(0, 1, 3, 4)) / full.abs().max()
    assert per_frame.min() > 0.02 and (frames - full).norm() / full.norm() > 0.02


def test_vae_tiling_decodes_in_tiles_as_the_pipeline_does(wan_dirs):
    policy = wan(wan_dirs["wan21"], vae_tiling=True)
    assert policy.vae.use_tiling
    tiles = (16, 16, 8, 8)  # Wan's tiles are 256 px: a 32 px frame is split only by smaller ones
    policy.vae.enable_tiling(*tiles)
    pipe = WanPipeline.from_pretrained(wan_dirs["wan21"])
    pipe.vae.enable_tiling(*tiles)
    latents = ode_sample(policy, 3, 4.0)
    video = policy.decode(latents)
    torch.testing.assert_close(video, pipe_call(pipe, policy, 3, 4.0, output_type="pt"), atol=1e-5, rtol=1e-5)
    assert (video - wan(wan_dirs["wan21"]).decode(latents)).abs().max() > 1e-2  # it was tiled (the random VAE's seams)
