"""The Qwen-Image 2.1 adapter on a tiny random-weight QwenImage21Pipeline loaded through from_pretrained (the
equality of its encodings, grid, guided velocity and sample with the pipeline's: ``test_fidelity.py``)."""

import json
import math
import shutil

import pytest
import torch
from diffusers import QwenImage21Pipeline

from flowrl.policies import LoraOptions, QwenImage21Policy
from tests.policies.mixed_precision import assert_mixed_precision
from tests.policies.pipeline_oracle import PROMPTS, adapter_ode, pipeline_run, start_noise

LORA = LoraOptions(rank=4, alpha=8)


def qwen21(path, **kw):
    return QwenImage21Policy(path, **{"lora": LORA, "resolution": 64, **kw}).load()


def with_index(path, out, **entries) -> str:
    """A copy of the folder ``path`` whose model_index.json has ``entries`` set."""
    shutil.copytree(path, out)
    index = json.loads((out / "model_index.json").read_text())
    (out / "model_index.json").write_text(json.dumps({**index, **entries}))
    return str(out)


def test_a_rows_encoding_and_velocity_do_not_depend_on_its_batch(qwen_image21_dir):
    policy = qwen21(qwen_image21_dir)
    pipe = QwenImage21Pipeline.from_pretrained(qwen_image21_dir)
    alone = [pipe.encode_prompt([p])[0][0] for p in PROMPTS]  # one prompt: no padding, no mask
    assert len(alone[0]) < len(alone[1])
    cond = policy.encode(PROMPTS)
    assert cond.extra["mask"].sum(1).tolist() == [len(a) for a in alone]
    for row, want in enumerate(alone):
        torch.testing.assert_close(cond.embeds[row, :len(want)], want)
    z, sigma = start_noise(policy), torch.tensor([0.8, 0.4])
    with torch.no_grad():
        both = policy.velocity(z, sigma, cond, 1.0)
        first = policy.velocity(z[:1], sigma[:1], policy.encode(PROMPTS[:1]), 1.0)
        padded = policy._denoise(z, sigma, cond.embeds)  # the pipeline's way: the shorter prompt padded
    torch.testing.assert_close(both[:1], first, atol=1e-6, rtol=0)
    assert (padded[:1] - first).abs().max() > 1e-3  # padding moves the image in RoPE: the grouping is needed


def test_under_fsdp2_each_row_is_its_own_denoiser_call(qwen_image21_dir, monkeypatch):
    # every FSDP2 call is a collective: the count must not depend on the batch's prompt lengths (rank-local)
    policy = qwen21(qwen_image21_dir)
    cond, z, sigma = policy.encode([PROMPTS[0]] * 2 + [PROMPTS[1]]), torch.randn(3, 8, 4, 4), torch.tensor([.9, .5, .2])
    calls, denoise = [], policy._denoise
    monkeypatch.setattr(policy, "_denoise", lambda *a: calls.append(len(a[0])) or denoise(*a))
    with torch.no_grad():
        grouped = policy.velocity(z, sigma, cond, 1.0)
        assert calls == [2, 1]  # one call per prompt length
        monkeypatch.setattr("flowrl.policies.qwen_image21.is_sharded", lambda module: True)
        calls.clear()
        torch.testing.assert_close(policy.velocity(z, sigma, cond, 1.0), grouped, atol=1e-6, rtol=0)
    assert calls == [1, 1, 1]


def test_sigmas_are_the_pipelines_shifted_grid_and_a_folders_sample_sigmas(qwen_image21_dir, tmp_path):
    policy, pipe = qwen21(qwen_image21_dir), QwenImage21Pipeline.from_pretrained(qwen_image21_dir)
    pipeline_run(pipe, prompt=PROMPTS[:1], num_inference_steps=4, height=64, width=64)
    torch.testing.assert_close(policy.sigmas(4), pipe.scheduler.sigmas, rtol=0, atol=0)
    # 64 px / 16 = 4 x 4 unpatched tokens: mu = 0.5 + (16 - 4) (0.9 - 0.5) / (16 - 4) = 0.9; the exponential shift
    # of linspace(1, 1/4, 4), stretched to end at the terminal 0.02
    s = torch.linspace(1.0, 0.25, 4, dtype=torch.float64)
    shifted = math.exp(0.9) / (math.exp(0.9) + 1 / s - 1)
    stretched = 1 - (1 - shifted) / ((1 - shifted[-1]) / (1 - 0.02))
    torch.testing.assert_close(policy.sigmas(4), torch.cat([stretched, torch.zeros(1, dtype=torch.float64)]).float())
    fixed = with_index(qwen_image21_dir, tmp_path / "fixed", sample_sigmas=[1.0, 0.7, 0.3])
    policy, pipe = QwenImage21Policy(fixed, resolution=64), QwenImage21Pipeline.from_pretrained(fixed)
    assert pipe.config.sample_sigmas == [1.0, 0.7, 0.3]
    pipeline_run(pipe.to(torch.float32), prompt=PROMPTS[:1], num_inference_steps=50, height=64, width=64)
    torch.testing.assert_close(policy.sigmas(3), pipe.scheduler.sigmas, rtol=0, atol=0)  # the pipeline ignores 50
    with pytest.raises(ValueError, match="its 3 sample_sigmas .* set the method's num_steps to 3"):
        policy.sigmas(4)


def test_ode_sample_and_rgb_images_equal_the_unguided_pipelines(qwen_image21_dir):
    policy, pipe = qwen21(qwen_image21_dir), QwenImage21Pipeline.from_pretrained(qwen_image21_dir)
    ours = adapter_ode(policy, steps=3, guidance=1.0, prompts=PROMPTS[:1], seeds=torch.tensor([11]))
    c, h, w = policy.latent_shape()
    packed = QwenImage21Pipeline._pack_latents(start_noise(policy, torch.tensor([11])), 1, c, h, w)
    theirs, images = pipeline_run(pipe, prompt=PROMPTS[:1], latents=packed, num_inference_steps=3, height=64,
                                  width=64)
    assert images.shape == (1, 4, 64, 64)  # the VAE decodes RGBA
    torch.testing.assert_close(QwenImage21Pipeline._pack_latents(ours, 1, c, h, w), theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.decode(ours), images[:, :3], atol=1e-5, rtol=1e-5)


def test_guide_is_plain_cfg(qwen_image21_dir):
    policy = QwenImage21Policy(qwen_image21_dir, resolution=64)  # no weights needed
    v_u, v_c = torch.randn(2, 8, 4, 4), torch.randn(2, 8, 4, 4)
    torch.testing.assert_close(policy.guide(v_u, v_c, 4.0), v_u + 4.0 * (v_c - v_u))


def test_a_wrong_folder_is_refused_before_any_weight_loads(qwen_image_dir, qwen_image21_dir, tmp_path,
                                                           refuse_weights):
    with pytest.raises(ValueError) as err:
        QwenImage21Policy(qwen_image_dir, resolution=48)
    lines = str(err.value).splitlines()[1:]  # every problem at once: 2.1's folder checks, then Qwen-Image's
    assert "resolution=48 must be a positive multiple of 32" in lines[0]
    assert "names QwenImagePipeline, not QwenImage21Pipeline" in lines[1] and "patch_size=2" in lines[2]
    published = with_index(qwen_image21_dir, tmp_path / "published", processor=["transformers", "Qwen3VLProcessor"])
    with pytest.raises(ValueError, match=r"transformers' Qwen3VLProcessor\) needs torchvision; pip install"):
        QwenImage21Policy(published)


def test_mixed_precision_keeps_trained_weights_and_velocities_in_float32(qwen_image21_dir):
    policy = qwen21(qwen_image21_dir, torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    assert_mixed_precision(policy, qwen21(qwen_image21_dir), torch.tensor([0.7]), 3.0)
