"""The LTX-2 image-to-video adapter against ``LTX2ImageToVideoPipeline`` on the tiny LTX-2 folder (the same components
as ``LTX2Pipeline``): the first frame's clean latent tokens, the prompt encodings, the sigma grid, the first step's
guided velocities (the video's later frames and the audio), a 3-step sample and its decoded video; the first frame
kept out of the sampled state; the pre-load refusals; LoRA and merged exports the plain pipeline reproduces."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, LTX2ImageToVideoPipeline

from flowrl.methods import FlowGRPO
from flowrl.policies import LTX2I2VPolicy
from flowrl.policies.export import export_lora, export_pipeline
from flowrl.policies.pipeline_policy import PolicyOptionsError
from flowrl.rewards.pil_images import to_pil
from tests.policies.fidelity import NEGATIVE
from tests.policies.fidelity_cases import first_frame
from tests.policies.pipeline_oracle import PROMPTS, SEEDS, start_noise
from tests.policies.test_ltx2 import GUIDANCE, LORA, SIZE, STEPS, gap, pipe_call

FIRST = 16 * 16  # the first latent frame's tokens: 16 x 16 of 4 channels


def i2v(path, **kw):
    return LTX2I2VPolicy(path, **{"lora": LORA, "max_sequence_length": 16, "negative_prompt": NEGATIVE,
                                  "image_crf": 0, **SIZE, **kw}).load()


def video_state(video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
    """The pipeline's step tensors of the later frames (``[B, C, F - 1, h, w]``) and the audio (packed) as flowrl's
    sampled state: the video packed as the pipeline packs it, then the audio."""
    tokens = LTX2ImageToVideoPipeline._pack_latents(video)
    return torch.cat([tokens.flatten(1), audio.flatten(1)], dim=1)


def pipelines_first_frame(pipe, image) -> torch.Tensor:
    """The clean tokens ``[h w, C]`` the pipeline's transformer reads first, from the pipeline's own encoding of
    ``image`` (its ``__call__`` without latents, 2 steps (1 has no terminal stretch), no re-compression)."""
    seen = {}
    hook = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: seen.setdefault("call", kw) and None,
                                                      with_kwargs=True)
    pipe.set_progress_bar_config(disable=True)
    pipe(image=image, prompt=PROMPTS[0], num_inference_steps=2, guidance_scale=1.0, image_crf=0,
         max_sequence_length=16, output_type="latent", **SIZE)
    hook.remove()
    call = seen["call"]
    assert call["timestep"][0, :FIRST].abs().max() == 0 and call["timestep"][0, FIRST:].min() > 0  # kept clean
    return call["hidden_states"][0, :FIRST]


def test_first_frame_encodings_velocity_sample_and_video_equal_the_pipelines(ltx2_dir, monkeypatch):
    policy, pipe = i2v(ltx2_dir), LTX2ImageToVideoPipeline.from_pretrained(ltx2_dir)
    image = first_frame()  # 40 x 56: the pipeline's processor resizes it to the video's 32 x 32
    clean = pipelines_first_frame(pipe, to_pil(image[None])[0])
    cond = policy.encode(list(PROMPTS), images=[[image], [image]])
    measured = {"first frame": gap(cond.shared["first_frame"], clean.flatten().expand(2, -1))}
    steps = []
    step = FlowMatchEulerDiscreteScheduler.step  # the video's and the audio's scheduler (a copy) alternate

    def recorded(self, out, *args, **kwargs):
        steps.append((out, step(self, out, *args, **kwargs)[0]))
        return (steps[-1][1],)

    monkeypatch.setattr(FlowMatchEulerDiscreteScheduler, "step", recorded)
    noise = start_noise(policy, SEEDS)
    assert noise.shape == (2, (3 - 1) * FIRST * 4 + 4 * 4)  # the later 2 latent frames, then the audio
    joint = torch.cat([clean.flatten().expand(2, -1), noise], dim=1)  # the pipeline's latents: its own first frame
    frames = pipe_call(pipe, policy, joint, unpacked=True, image=to_pil(image[None])[0], image_crf=0,
                       output_type="pt").frames
    sigmas = policy.sigmas(STEPS)
    measured["sigmas"] = gap(sigmas, pipe.scheduler.sigmas)
    with torch.no_grad():
        velocity = policy.velocity(noise, sigmas[:1].expand(2), cond, GUIDANCE)
    final = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.final_latents(cond, SEEDS, STEPS)
    (video_v, _), (audio_v, _), *_, (_, video_end), (_, audio_end) = steps
    measured["velocity"] = gap(velocity, video_state(video_v, audio_v))
    measured["sample"] = gap(final, video_state(video_end, audio_end))
    measured["video"] = gap(policy.decode(final, cond), frames)
    print(measured)  # the Video page's numbers
    assert len(steps) == 2 * STEPS and frames.shape == (2, 5, 3, 32, 32)
    assert max(measured.values()) <= 1e-5, measured
    with pytest.raises(ValueError, match="keeps each row's first frame out of the sampled state"):
        policy.decode(final)
    other = policy.encode(list(PROMPTS), images=[[1 - image], [1 - image]])
    assert gap(policy.decode(final, other), frames) > 1e-2  # the decode reads the row's first frame


def test_bad_options_are_refused_before_any_weight_loads(ltx2_dir, refuse_weights, monkeypatch):
    monkeypatch.setattr("diffusers.utils.is_av_available", lambda: False)
    with pytest.raises(PolicyOptionsError) as err:
        LTX2I2VPolicy(ltx2_dir, height=48, image_cache_size=-1, **{k: v for k, v in SIZE.items() if k != "height"})
    assert len(err.value.problems) == 3, err.value.problems
    # the tiny folder's Gemma-3: the pipeline's CRF 33, which needs PyAV
    assert "re-compresses the first frame as one H.264 frame at CRF 33" in str(err.value)
    assert "height=48" in err.value.problems[0] and "image_cache_size=-1" in str(err.value)
    assert LTX2I2VPolicy(ltx2_dir, image_crf=0, **SIZE).latent_shape() == (2 * FIRST * 4 + 16,)


def test_exported_lora_and_merged_pipeline_reproduce_the_adapters_video(ltx2_dir, tmp_path):
    policy, image = i2v(ltx2_dir), first_frame()
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.generate(list(PROMPTS), SEEDS, 2,
                                                                          images=[[image], [image]])
    cond = policy.encode(list(PROMPTS), images=[[image], [image]])
    joint, pil = policy._joint(start_noise(policy, SEEDS), cond), to_pil(image[None])[0]
    export_lora(policy, tmp_path / "lora")
    pipe = LTX2ImageToVideoPipeline.from_pretrained(ltx2_dir)
    call = dict(steps=2, unpacked=True, image=pil, image_crf=0, output_type="pt")
    assert gap(pipe_call(pipe, policy, joint, **call).frames, ours) > 1e-3  # the LoRA matters
    pipe.load_lora_weights(tmp_path / "lora")
    torch.testing.assert_close(pipe_call(pipe, policy, joint, **call).frames, ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = LTX2ImageToVideoPipeline.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(pipe_call(merged, policy, joint, **call).frames, ours, atol=1e-5, rtol=1e-4)
