"""The Z-Image adapter on a tiny random-weight ZImagePipeline loaded through from_pretrained."""

import pytest
import torch
from diffusers import ZImagePipeline

from flowrl.policies import LoraOptions, ZImagePolicy
from tests.policies.chunked_decode import assert_decodes_in_chunks
from tests.policies.mixed_precision import assert_mixed_precision
from tests.policies.pipeline_oracle import PROMPTS, adapter_ode, pipeline_run, start_noise

LORA = LoraOptions(rank=4, alpha=8)


def zimage(path, **kw):
    return ZImagePolicy(path, **{"lora": LORA, "resolution": 32, "max_sequence_length": 32, **kw}).load()


def test_encoding_is_the_pipelines_real_tokens_padded_to_one_length(zimage_dir):
    policy = zimage(zimage_dir)
    pipe = ZImagePipeline.from_pretrained(zimage_dir)
    prompts = list(PROMPTS)
    want, null = pipe.encode_prompt(prompts, do_classifier_free_guidance=True, max_sequence_length=32)
    assert prompts != PROMPTS  # the trap the adapter avoids: the pipeline templated the caller's list in place
    cond = policy.encode(PROMPTS)
    lengths = [len(w) for w in want]
    assert lengths[0] < lengths[1] == cond.embeds.shape[1] == cond.null_embeds.shape[1]
    assert cond.extra["mask"].sum(1).tolist() == lengths
    for i, row in enumerate(want):
        torch.testing.assert_close(cond.embeds[i, :lengths[i]], row)
        torch.testing.assert_close(cond.null_embeds[i, :len(null[i])], null[i])
    assert policy.encode(PROMPTS).extra["mask"].sum(1).tolist() == lengths  # the cached prompts are not re-templated


def test_velocity_is_the_negated_output_at_reversed_time(zimage_dir):
    policy = zimage(zimage_dir)
    cond, z, sigma = policy.encode(PROMPTS), torch.randn(2, 4, 16, 16), torch.tensor([0.75, 0.25])
    assert policy.latent_shape() == (4, 16, 16)  # 32 px / VAE factor 2; the transformer patchifies itself
    with torch.no_grad():
        v = policy.velocity(z, sigma, cond, 1.0)
        captions = [cond.embeds[i, cond.extra["mask"][i]] for i in range(2)]
        out = policy.denoiser(list(z.unsqueeze(2)), torch.tensor([0.25, 0.75]), captions, return_dict=False)[0]
    torch.testing.assert_close(v, -torch.stack(out).squeeze(2))


def test_sigmas_are_the_pipelines_grid(zimage_dir):
    policy, pipe = zimage(zimage_dir), ZImagePipeline.from_pretrained(zimage_dir)
    pipeline_run(pipe, prompt=PROMPTS[:1], num_inference_steps=4, height=32, width=32, guidance_scale=0.0,
                 max_sequence_length=32)
    torch.testing.assert_close(policy.sigmas(4), pipe.scheduler.sigmas, rtol=0, atol=0)
    s = torch.linspace(1.0, 0.25, 4)  # the static shift 3: 3 s / (1 + 2 s)
    torch.testing.assert_close(policy.sigmas(4), torch.cat([3 * s / (1 + 2 * s), torch.zeros(1)]))


@pytest.mark.parametrize("normalization", [0.0, 1.0], ids=["cfg", "cfg_normalized"])
def test_ode_sample_and_images_equal_the_pipelines(zimage_dir, normalization):
    policy, pipe = zimage(zimage_dir, cfg_normalization=normalization), ZImagePipeline.from_pretrained(zimage_dir)
    ours = adapter_ode(policy, steps=3, guidance=3.0)  # flowrl's w = 3 is the pipeline's g = w - 1 = 2
    theirs, images = pipeline_run(pipe, prompt=list(PROMPTS), guidance_scale=2.0, cfg_normalization=normalization,
                                  latents=start_noise(policy), num_inference_steps=3, height=32, width=32,
                                  max_sequence_length=32)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.decode(ours), images, atol=1e-5, rtol=1e-5)
    other = adapter_ode(zimage(zimage_dir, cfg_normalization=1.0 - normalization), steps=3, guidance=3.0)
    assert (other - ours).abs().max() > 1e-3  # the normalization is active here, so both matches are informative


def test_turbo_style_sampling_without_cfg_equals_the_pipelines(zimage_dir):
    policy, pipe = zimage(zimage_dir), ZImagePipeline.from_pretrained(zimage_dir)
    ours = adapter_ode(policy, steps=2, guidance=1.0)
    theirs, _ = pipeline_run(pipe, prompt=list(PROMPTS), guidance_scale=0.0, latents=start_noise(policy),
                             num_inference_steps=2, height=32, width=32, max_sequence_length=32)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_decode_in_chunks_equals_whole(zimage_dir, monkeypatch):
    assert_decodes_in_chunks(lambda **kw: zimage(zimage_dir, **kw), monkeypatch)


def test_bad_options_fail_before_any_weight_loads(zimage_dir, refuse_weights):
    with pytest.raises(ValueError, match=r"resolution=30 must be a positive multiple of 4(.|\n)*"
                                         r"cfg_normalization=-0.5 must be >= 0"):
        zimage(zimage_dir, resolution=30, cfg_normalization=-0.5)


def test_mixed_precision_keeps_trained_weights_and_velocities_in_float32(zimage_dir):
    policy = zimage(zimage_dir, torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    assert_mixed_precision(policy, zimage(zimage_dir), torch.tensor([0.7]), 3.0)
