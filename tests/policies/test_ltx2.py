"""The LTX-2 adapter against ``LTX2Pipeline`` on a tiny random-weight folder loaded through ``from_pretrained``: the
encodings the transformer reads, the sigma grid, the first step's guided velocities (video and audio), a 3-step
sample and its decoded video; the pre-load refusals; LoRA on the video stream only, exported for the plain pipeline."""

import json
import math
import shutil

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline

from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, LTX2Policy
from flowrl.policies.export import export_lora, export_pipeline
from tests.policies.fidelity import NEGATIVE
from tests.policies.pipeline_oracle import PROMPTS, SEEDS, start_noise
from tests.policies.tiny_ltx2 import FRAME_RATE, FRAMES, HEIGHT, WIDTH

SIZE = dict(height=HEIGHT, width=WIDTH, num_frames=FRAMES, frame_rate=FRAME_RATE)
STEPS, GUIDANCE = 3, 3.0
LORA = LoraOptions(rank=4, alpha=8)


def ltx2(path, **kw):
    return LTX2Policy(path, **{"lora": LORA, "max_sequence_length": 16, "negative_prompt": NEGATIVE, **SIZE,
                               **kw}).load()


def pipe_call(pipe, policy, noise, steps=STEPS, guidance=GUIDANCE, unpacked=False, **kw):
    """The pipeline from flowrl's start ``noise`` (the video tokens as ``latents``, ``unpacked``: as the un-normalised
    ``[B, C, F, h, w]`` grid the image-to-video pipeline takes and normalises; the audio tokens as ``audio_latents``,
    which the pipeline normalises: given un-normalised), with the policy's guidance settings and neither STG nor
    modality guidance."""
    video, audio = policy.layout.tokens(noise)
    if unpacked:
        vae = pipe.vae
        video = pipe._denormalize_latents(pipe._unpack_latents(video, *policy.layout.video_grid), vae.latents_mean,
                                          vae.latents_std, vae.config.scaling_factor)
    mean, std = pipe.audio_vae.latents_mean, pipe.audio_vae.latents_std
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt=list(PROMPTS), negative_prompt=NEGATIVE, latents=video, audio_latents=audio * std + mean,
                num_inference_steps=steps, guidance_scale=guidance, audio_guidance_scale=policy.audio_guidance_scale,
                guidance_rescale=policy.guidance_rescale, audio_guidance_rescale=policy.audio_guidance_rescale,
                stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0,
                max_sequence_length=16, **{k: v for k, v in SIZE.items() if k != "frame_rate"},
                frame_rate=FRAME_RATE, **kw)


def gap(ours, theirs) -> float:
    return (ours.float() - theirs.float()).abs().max().item()


def test_encodings_velocity_sample_and_video_equal_the_pipelines(ltx2_dir, monkeypatch):
    policy, pipe = ltx2(ltx2_dir), LTX2Pipeline.from_pretrained(ltx2_dir)
    steps, seen = [], {}
    step = FlowMatchEulerDiscreteScheduler.step  # the video's and the audio's scheduler (a copy) alternate

    def recorded(self, out, *args, **kwargs):
        steps.append((out, step(self, out, *args, **kwargs)[0]))
        return (steps[-1][1],)

    monkeypatch.setattr(FlowMatchEulerDiscreteScheduler, "step", recorded)
    pipe.transformer.register_forward_pre_hook(lambda m, a, kw: seen.setdefault("call", kw) and None,
                                                 with_kwargs=True)
    noise = start_noise(policy, SEEDS)
    frames = pipe_call(pipe, policy, noise, output_type="pt").frames
    cond = policy.encode(list(PROMPTS))
    call = seen["call"]  # the pipeline's encodings as its transformer read them: [negatives, prompts]
    measured = {"encode": max(gap(torch.cat(ours), call[key]) for ours, key in [
        ((cond.null_embeds, cond.embeds), "encoder_hidden_states"),
        ((cond.null_extra["audio_embeds"], cond.extra["audio_embeds"]), "audio_encoder_hidden_states"),
        ((cond.null_extra["mask"], cond.extra["mask"]), "encoder_attention_mask")])}
    sigmas = policy.sigmas(STEPS)
    measured["sigmas"] = gap(sigmas, pipe.scheduler.sigmas)
    with torch.no_grad():
        velocity = policy.velocity(noise, sigmas[:1].expand(len(noise)), cond, GUIDANCE)
    final = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.final_latents(cond, SEEDS, STEPS)
    (video_v, _), (audio_v, _), *_, (_, video_end), (_, audio_end) = steps
    measured["velocity"] = gap(velocity, policy.layout.flat(video_v, audio_v))
    measured["sample"] = gap(final, policy.layout.flat(video_end, audio_end))
    measured["video"] = gap(policy.decode(final), frames)
    assert len(steps) == 2 * STEPS and frames.shape == (2, FRAMES, 3, HEIGHT, WIDTH)
    assert max(measured.values()) <= 1e-5, measured
    assert (policy.decode(final) - policy.decode(noise)).abs().max() > 1e-2  # the decode reads the latents


def test_sigmas_are_the_shifted_grid_stretched_to_the_terminal_sigma(ltx2_dir):
    policy = LTX2Policy(ltx2_dir, **SIZE)  # no weights needed
    # 3 x 16 x 16 = 768 video tokens: mu = 0.95 + (768 - 256) (2.05 - 0.95) / (1024 - 256) = 1.68333; the exponential
    # shift of linspace(1, 1/3, 3), stretched so that the last sigma is the terminal 0.1
    s = torch.linspace(1.0, 1 / 3, 3, dtype=torch.float64)
    mu = 0.95 + 512 * 1.1 / 768
    shifted = math.exp(mu) / (math.exp(mu) + 1 / s - 1)
    stretched = 1 - (1 - shifted) / ((1 - shifted[-1]) / (1 - 0.1))
    torch.testing.assert_close(policy.sigmas(3), torch.cat([stretched, torch.zeros(1, dtype=torch.float64)]).float())
    assert policy.latent_shape() == (768 * 4 + 4 * 4,)  # video tokens x 4 channels, then 4 audio frames x 2 x 2 mels


def test_lora_trains_the_video_stream_and_the_audio_tokens_follow(ltx2_dir):
    policy = ltx2(ltx2_dir)
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert names and all(".attn1." in n or ".attn2." in n for n in names)  # no audio_attn*, no cross-modal attention
    cond, z = policy.encode(list(PROMPTS[:1])), start_noise(policy, SEEDS[:1])
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
        moved = policy.velocity(z, torch.tensor([0.7]), cond, 1.0)
        with policy.reference():
            base = policy.velocity(z, torch.tensor([0.7]), cond, 1.0)
    video, audio = (gap(a, b) for a, b in zip(policy.layout.split(moved), policy.layout.split(base)))
    assert video > 1e-3 and audio > 1e-6  # the audio stream reads the trained video stream (video_to_audio_attn)


def with_configs(path, out, index=None, vae=None) -> str:
    """A copy of the folder ``path`` with entries of its model_index.json and video VAE config replaced."""
    shutil.copytree(path, out)
    for name, entries in (("model_index.json", index), ("vae/config.json", vae)):
        config = json.loads((out / name).read_text())
        (out / name).write_text(json.dumps({**config, **(entries or {})}))
    return str(out)


def test_bad_options_and_folders_are_refused_before_any_weight_loads(ltx2_dir, tmp_path, refuse_weights):
    with pytest.raises(ValueError) as err:
        LTX2Policy(ltx2_dir, height=48, width=32, num_frames=6, max_sequence_length=0, guidance_rescale=1.5)
    lines = str(err.value).splitlines()[1:]
    assert "height=48 must be a positive multiple of 32" in lines[0]
    assert "num_frames=6 must be 1 + a multiple of 2" in lines[1] and "max_sequence_length=0" in lines[2]
    assert "guidance_rescale=1.5 must be in [0, 1]" in lines[3] and len(lines) == 4
    other = with_configs(ltx2_dir, tmp_path / "other", index={"_class_name": "LTXPipeline"},
                         vae={"timestep_conditioning": True})
    with pytest.raises(ValueError, match=r"(?s)names LTXPipeline, not one of .*timestep conditioning"):
        LTX2Policy(other, **SIZE)


def test_exported_lora_and_merged_pipeline_reproduce_the_adapters_ode_video(ltx2_dir, tmp_path):
    policy = ltx2(ltx2_dir)
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.generate(list(PROMPTS), SEEDS, STEPS)
    noise = start_noise(policy, SEEDS)
    export_lora(policy, tmp_path / "lora")
    pipe = LTX2Pipeline.from_pretrained(ltx2_dir)
    assert gap(pipe_call(pipe, policy, noise, output_type="pt").frames, ours) > 1e-3  # the LoRA matters
    pipe.load_lora_weights(tmp_path / "lora")
    torch.testing.assert_close(pipe_call(pipe, policy, noise, output_type="pt").frames, ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = LTX2Pipeline.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(pipe_call(merged, policy, noise, output_type="pt").frames, ours, atol=1e-5, rtol=1e-4)
