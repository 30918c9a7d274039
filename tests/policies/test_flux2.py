"""The FLUX.2 adapter on tiny random-weight Flux2KleinPipeline folders (base: CFG; step-distilled: none) loaded
through from_pretrained."""

import numpy as np
import pytest
import torch
from diffusers import Flux2KleinPipeline

from flowrl.policies import Flux2Policy, LoraOptions
from tests.policies.mixed_precision import assert_mixed_precision
from tests.policies.pipeline_oracle import PROMPTS, adapter_ode, pipeline_run, start_noise

LORA = LoraOptions(rank=4, alpha=8)


def flux2(path, **kw):
    return Flux2Policy(path, **{"lora": LORA, "resolution": 32, "max_sequence_length": 16, **kw}).load()


def test_encoding_is_the_pipelines_and_distilled_models_have_no_unconditional_side(flux2_dir, flux2_distilled_dir):
    policy = flux2(flux2_dir)
    pipe = Flux2KleinPipeline.from_pretrained(flux2_dir)
    want, text_ids = pipe.encode_prompt(PROMPTS, max_sequence_length=16)
    null, _ = pipe.encode_prompt([""], max_sequence_length=16)
    cond = policy.encode(PROMPTS)
    # [B, 16 tokens, 3 hidden layers x 16]: every prompt padded to max_sequence_length, all tokens real
    assert cond.embeds.shape == (2, 16, 48) and cond.extra["mask"].all()
    torch.testing.assert_close(cond.embeds, want)
    torch.testing.assert_close(cond.null_embeds, null.expand(2, -1, -1))
    assert not flux2(flux2_distilled_dir).encode(PROMPTS).guided  # step-distilled: no CFG


def test_latents_are_patchified_and_the_transformer_sees_tokens(flux2_dir):
    policy = flux2(flux2_dir)
    assert policy.latent_shape() == (16, 8, 8)  # 4 VAE channels x 2x2 patch; 32 px / VAE factor 2 / patch 2
    cond, z, sigma = policy.encode(PROMPTS[:1]), torch.randn(1, 16, 8, 8), torch.tensor([0.6])
    with torch.no_grad():
        v = policy.velocity(z, sigma, cond, 1.0)
        tokens = z.flatten(2).transpose(1, 2)  # [1, 64 tokens, 16 channels], row-major as the position ids
        ids = torch.cartesian_prod(torch.arange(1), torch.arange(8), torch.arange(8), torch.arange(1))
        direct = policy.denoiser(hidden_states=tokens, encoder_hidden_states=cond.embeds, timestep=sigma,
                                 img_ids=ids[None], txt_ids=Flux2KleinPipeline._prepare_text_ids(cond.embeds),
                                 return_dict=False)[0]
    torch.testing.assert_close(v.flatten(2).transpose(1, 2), direct)


def test_sigmas_are_the_pipelines_grid(flux2_dir):
    policy, pipe = flux2(flux2_dir), Flux2KleinPipeline.from_pretrained(flux2_dir)
    pipeline_run(pipe, prompt=PROMPTS[:1], num_inference_steps=4, height=32, width=32, max_sequence_length=16)
    torch.testing.assert_close(policy.sigmas(4), pipe.scheduler.sigmas, rtol=0, atol=0)
    # compute_empirical_mu(64 tokens, T=4): the line through mu(T=10) = 8.73809524e-05 n + 1.89833333 and
    # mu(T=200) = 0.00016927 n + 0.45666666, read at T = 4; then e^mu / (e^mu + 1/s - 1), s = linspace(1, 1/4, 4)
    m10, m200 = 8.73809524e-05 * 64 + 1.89833333, 0.00016927 * 64 + 0.45666666
    mu = m200 + (4 - 200) * (m200 - m10) / 190
    s = np.linspace(1.0, 0.25, 4)
    want = np.exp(mu) / (np.exp(mu) + 1 / s - 1)
    torch.testing.assert_close(policy.sigmas(4), torch.tensor([*want, 0.0], dtype=torch.float32))
    assert not torch.allclose(policy.sigmas(4)[1:-1], policy.sigmas(8)[2:-1:2])  # mu depends on T as well


@pytest.mark.parametrize("distilled", [False, True], ids=["base_cfg", "distilled"])
def test_ode_sample_and_images_equal_the_pipelines(flux2_dir, flux2_distilled_dir, distilled):
    path = flux2_distilled_dir if distilled else flux2_dir
    policy, pipe = flux2(path), Flux2KleinPipeline.from_pretrained(path)
    ours = adapter_ode(policy, steps=3, guidance=3.0)
    packed = Flux2KleinPipeline._pack_latents(start_noise(policy))  # the pipeline takes [B, 4C, h, w] latents
    theirs, images = pipeline_run(pipe, prompt=PROMPTS, guidance_scale=3.0, latents=start_noise(policy),
                                  num_inference_steps=3, height=32, width=32, max_sequence_length=16)
    assert theirs.shape == packed.shape
    torch.testing.assert_close(Flux2KleinPipeline._pack_latents(ours), theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.decode(ours), images, atol=1e-5, rtol=1e-5)
    unguided = adapter_ode(policy, steps=3, guidance=1.0)
    assert torch.equal(unguided, ours) == distilled  # the distilled model ignores guidance; the base one uses CFG


def test_default_lora_targets_cover_both_block_kinds(flux2_dir):
    policy = flux2(flux2_dir)
    wrapped = {name.rsplit(".lora_A", 1)[0] for name, _ in policy.denoiser.named_parameters() if ".lora_A." in name}
    assert wrapped == {"transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k",
                       "transformer_blocks.0.attn.to_v", "transformer_blocks.0.attn.to_out.0",
                       "single_transformer_blocks.0.attn.to_qkv_mlp_proj", "single_transformer_blocks.0.attn.to_out"}


def test_decode_in_chunks_equals_whole(flux2_dir):
    z = torch.randn(3, 16, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(flux2(flux2_dir, vae_chunk_size=2).decode(z), flux2(flux2_dir).decode(z))


def test_bad_options_fail_before_any_weight_loads(flux2_dir, sd3_dir, refuse_weights):
    with pytest.raises(ValueError, match=r"resolution=30 must be a positive multiple of 4(.|\n)*"
                                         r"max_sequence_length=0 must be >= 1"):
        flux2(flux2_dir, resolution=30, max_sequence_length=0)  # 4: VAE factor 2 x 2x2 patches
    with pytest.raises(ValueError, match="names StableDiffusion3Pipeline, not a FLUX.2 pipeline"):
        flux2(sd3_dir)


def test_mixed_precision_keeps_trained_weights_and_velocities_in_float32(flux2_dir):
    policy = flux2(flux2_dir, torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    assert_mixed_precision(policy, flux2(flux2_dir), torch.tensor([0.7]), 3.0)


def test_dev_is_guidance_distilled_and_its_ode_sample_equals_flux2_pipeline(flux2_dev_dir):
    from diffusers import Flux2Pipeline

    policy, pipe = flux2(flux2_dev_dir, max_sequence_length=48), Flux2Pipeline.from_pretrained(flux2_dev_dir)
    assert policy.pipeline_class is Flux2Pipeline and type(policy.text_encoder).__name__.startswith("Mistral3")
    want, _ = pipe.encode_prompt(PROMPTS, max_sequence_length=48)  # system message + prompt, layers 10, 20, 30
    cond = policy.encode(PROMPTS)
    assert not cond.guided  # the guidance scale is an input of the transformer, not a CFG batch
    torch.testing.assert_close(cond.embeds, want)
    ours = adapter_ode(policy, steps=3, guidance=3.0)
    theirs, images = pipeline_run(pipe, prompt=PROMPTS, guidance_scale=3.0, latents=start_noise(policy),
                                  num_inference_steps=3, height=32, width=32, max_sequence_length=48)
    torch.testing.assert_close(Flux2Pipeline._pack_latents(ours), theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.decode(ours), images, atol=1e-5, rtol=1e-5)
    assert (adapter_ode(policy, steps=3, guidance=1.0) - ours).abs().max() > 1e-3  # the guidance input matters
