"""The Qwen-Image adapter on a tiny random-weight QwenImagePipeline loaded through from_pretrained."""

import math

import pytest
import torch
from diffusers import QwenImagePipeline

from flowrl.policies import LoraOptions, QwenImagePolicy
from tests.policies.mixed_precision import assert_mixed_precision
from tests.policies.pipeline_oracle import PROMPTS, adapter_ode, pipeline_run, start_noise

LORA = LoraOptions(rank=4, alpha=8)


def qwen(path, **kw):
    return QwenImagePolicy(path, **{"lora": LORA, "resolution": 32, "max_sequence_length": 16, **kw}).load()


def test_encoding_is_the_pipelines_padded_to_one_length_and_cached(qwen_image_dir, monkeypatch):
    policy = qwen(qwen_image_dir)
    pipe = QwenImagePipeline.from_pretrained(qwen_image_dir)
    want, want_mask = pipe.encode_prompt(PROMPTS, max_sequence_length=16)
    null, null_mask = pipe.encode_prompt([""], max_sequence_length=16)
    assert want_mask is not None and null_mask is None  # prompts of two lengths; the empty prompt alone is unpadded
    calls = []
    encode_rows = policy._encode_rows
    monkeypatch.setattr(policy, "_encode_rows", lambda p: calls.append(list(p)) or encode_rows(p))
    cond = policy.encode([*PROMPTS, PROMPTS[0]])
    assert calls == [PROMPTS, [""]]  # each distinct prompt once, then the negative prompt
    length = want.shape[1]  # the longer prompt; the empty prompt is shorter
    assert cond.embeds.shape[1] == cond.null_embeds.shape[1] == length > null.shape[1]
    torch.testing.assert_close(cond.embeds[:2], want)
    torch.testing.assert_close(cond.extra["mask"][:2], want_mask.bool())
    torch.testing.assert_close(cond.null_embeds[0, :null.shape[1]], null[0])
    assert cond.null_extra["mask"].sum(1).tolist() == [null.shape[1]] * 3
    assert cond.null_embeds[:, null.shape[1]:].abs().max() == 0  # padding is zeros
    policy.encode(PROMPTS[::-1])
    assert len(calls) == 2  # all cached


def test_sigmas_are_the_pipelines_grid(qwen_image_dir):
    policy, pipe = qwen(qwen_image_dir), QwenImagePipeline.from_pretrained(qwen_image_dir)
    pipeline_run(pipe, prompt=PROMPTS[:1], num_inference_steps=4, height=32, width=32, max_sequence_length=16)
    torch.testing.assert_close(policy.sigmas(4), pipe.scheduler.sigmas, rtol=0, atol=0)
    # 32 px / VAE factor 4 = 8x8 latents, 4x4 = 16 packed tokens: mu = 0.5 + (16 - 4) (0.9 - 0.5) / (64 - 4) = 0.58;
    # the exponential shift e^mu / (e^mu + 1/s - 1) of s = linspace(1, 1/4, 4), then stretched so the last is 0.02
    s = torch.linspace(1.0, 0.25, 4, dtype=torch.float64)
    shifted = math.exp(0.58) / (math.exp(0.58) + 1 / s - 1)
    stretched = 1 - (1 - shifted) / ((1 - shifted[-1]) / (1 - 0.02))
    torch.testing.assert_close(policy.sigmas(4), torch.cat([stretched, torch.zeros(1, dtype=torch.float64)]).float())


def test_ode_sample_and_images_equal_the_pipelines_with_true_cfg(qwen_image_dir):
    policy, pipe = qwen(qwen_image_dir), QwenImagePipeline.from_pretrained(qwen_image_dir)
    assert policy.latent_shape() == (4, 8, 8)  # 16 packed channels / 4; 32 px / VAE factor 4
    ours = adapter_ode(policy, steps=3, guidance=3.0)
    c, h, w = policy.latent_shape()
    packed = QwenImagePipeline._pack_latents(start_noise(policy), 2, c, h, w)
    theirs, images = pipeline_run(pipe, prompt=PROMPTS, negative_prompt=[""] * 2, true_cfg_scale=3.0, latents=packed,
                                  num_inference_steps=3, height=32, width=32, max_sequence_length=16)
    torch.testing.assert_close(QwenImagePipeline._pack_latents(ours, 2, c, h, w), theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.decode(ours), images, atol=1e-5, rtol=1e-5)
    unguided = adapter_ode(policy, steps=3, guidance=1.0)
    assert (unguided - ours).abs().max() > 1e-2  # guidance (and its rescale) matter, so the match above is theirs


def test_guide_rescales_each_token_to_its_conditional_norm(qwen_image_dir):
    policy = qwen(qwen_image_dir)
    v_u, v_c = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    out = policy.guide(v_u, v_c, 4.0)
    pack = lambda v: QwenImagePipeline._pack_latents(v, 2, 4, 8, 8)  # noqa: E731
    combined = pack(v_u + 4.0 * (v_c - v_u))
    # same direction as plain CFG per token, with the conditional velocity's norm
    torch.testing.assert_close(pack(out).norm(dim=-1), pack(v_c).norm(dim=-1))
    cos = torch.nn.functional.cosine_similarity(pack(out), combined, dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos))


def test_decode_in_chunks_equals_whole(qwen_image_dir):
    z = torch.randn(3, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(qwen(qwen_image_dir, vae_chunk_size=2).decode(z), qwen(qwen_image_dir).decode(z))


def test_bad_options_fail_before_any_weight_loads(qwen_image_dir, refuse_weights):
    with pytest.raises(ValueError, match=r"resolution=30 must be a positive multiple of 8(.|\n)*"
                                         r"max_sequence_length=0 must be in \[1, 1024\]"):
        qwen(qwen_image_dir, resolution=30, max_sequence_length=0)  # 8: VAE factor 4 x 2x2 packing


def test_mixed_precision_keeps_trained_weights_and_velocities_in_float32(qwen_image_dir):
    policy = qwen(qwen_image_dir, torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    assert_mixed_precision(policy, qwen(qwen_image_dir), torch.tensor([0.7]), 3.0)
