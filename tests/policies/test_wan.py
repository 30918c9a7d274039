"""The Wan text-to-video adapter on tiny random-weight WanPipelines loaded through from_pretrained: the pipeline's
encodings, sigma grids and timesteps, its ODE sample and decoded video for the same noise, Wan 2.2's expert switch
at the pipeline's step, LoRA on one expert or both, and bad sizes refused before the transformer loads."""

import pytest
import torch
from diffusers import WanPipeline

from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, WanPolicy
from flowrl.sampling.sampler import sample, seeded_noise
from flowrl.sampling.solver import solver_sample
from flowrl.sampling.steps import ODE_STEPS
from tests.policies.tiny_wan import FRAMES, SIZE

LORA = LoraOptions(rank=4, alpha=8)
PROMPTS, SEEDS = ["a red cat", "a blue dog"], torch.tensor([11, 12])


def wan(path, **kw):
    return WanPolicy(path, **{"lora": LORA, "height": SIZE, "width": SIZE, "num_frames": FRAMES,
                              "max_sequence_length": 16, **kw}).load()


def pipe_call(pipe, policy, steps, guidance, **kw):
    """The plain pipeline from the sampler's initial noise (``latents``), its own prompts and negative prompt."""
    noise = seeded_noise(SEEDS, policy.latent_shape(), 1)[:, 0]
    return pipe(PROMPTS, negative_prompt=policy.negative_prompt, height=SIZE, width=SIZE, num_frames=FRAMES,
                num_inference_steps=steps, guidance_scale=guidance, latents=noise, max_sequence_length=16, **kw).frames


def ode_sample(policy, steps, guidance):
    cond = policy.encode(PROMPTS)
    velocity = lambda z, sigma, rows: policy.velocity(z, sigma, cond.select(rows), guidance)  # noqa: E731
    latents, _ = sample(velocity, SEEDS, policy.sigmas(steps), policy.latent_shape(), ODE_STEPS["velocity"])
    return latents[:, -1]


def test_encoding_is_the_pipelines_with_its_negative_prompt_and_cached(wan_dirs, monkeypatch):
    policy = wan(wan_dirs["wan21"], negative_prompt="blurry")
    pipe = WanPipeline.from_pretrained(wan_dirs["wan21"])
    want, neg = pipe.encode_prompt(PROMPTS + PROMPTS[:1], "blurry", True, max_sequence_length=16)
    calls = []
    encode_batch = policy._encode_batch
    monkeypatch.setattr(policy, "_encode_batch", lambda p: calls.append(list(p)) or encode_batch(p))
    cond = policy.encode(PROMPTS + PROMPTS[:1])
    assert calls == [PROMPTS, ["blurry"]] and cond.pooled is None  # each distinct prompt once; UMT5 has no pooled
    assert cond.embeds.shape == (3, 16, 32)  # zero-padded to max_sequence_length, d_model 32
    torch.testing.assert_close(cond.embeds, want)
    torch.testing.assert_close(cond.null_embeds, neg)


def test_sigma_grid_and_timesteps_are_the_schedulers(wan_dirs):
    euler = wan(wan_dirs["wan21"])
    pipe = WanPipeline.from_pretrained(wan_dirs["wan21"])
    pipe.scheduler.set_timesteps(5)
    torch.testing.assert_close(euler.sigmas(5), pipe.scheduler.sigmas.float(), atol=0, rtol=0)
    torch.testing.assert_close(euler.timesteps(euler.sigmas(5)[:-1]), pipe.scheduler.timesteps.float())
    unipc = wan(wan_dirs["wan22"])  # as published: UniPC, flow_shift 12, integer timesteps
    pipe = WanPipeline.from_pretrained(wan_dirs["wan22"])
    pipe.scheduler.set_timesteps(5)
    sigmas = unipc.sigmas(5)
    # UniPC's first sigma is 1 - 1e-6 (its solver's guard); flowrl's is 1, with the pipeline's timestep 999
    assert pipe.scheduler.sigmas[0] == pytest.approx(1 - 1e-6, abs=1e-7) and sigmas[0] == 1.0
    torch.testing.assert_close(sigmas[1:], pipe.scheduler.sigmas[1:].float(), atol=0, rtol=0)
    assert unipc.timesteps(sigmas[:-1]).tolist() == pipe.scheduler.timesteps.float().tolist()
    assert pipe.scheduler.timesteps.dtype == torch.int64 and unipc.timesteps(sigmas[:-1])[0] == 999
    shifted = wan(wan_dirs["wan22"], flow_shift=3.0).sigmas(5)  # the docs' 480p shift, 3s / (1 + 2s) of s = 0.8
    assert shifted[1] == pytest.approx(3 * 0.8002 / (1 + 2 * 0.8002), abs=1e-4) and shifted[1] < sigmas[1]


@pytest.mark.parametrize("name, extra", [("wan21", {}), ("wan22_euler", {"guidance_scale_2": 2.0})],
                         ids=["wan21", "wan22"])
def test_ode_sample_and_video_are_the_pipelines_for_the_same_noise(wan_dirs, name, extra):
    policy = wan(wan_dirs[name], **extra)
    pipe = WanPipeline.from_pretrained(wan_dirs[name])
    ours = ode_sample(policy, 4, 4.0)
    want = pipe_call(pipe, policy, 4, 4.0, output_type="latent", **extra)
    assert ours.shape == (2, 16, 3, 4, 4)  # 9 frames -> 3 latent frames, 32 px -> 4
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)
    video = policy.decode(ours)
    assert video.shape == (2, FRAMES, 3, SIZE, SIZE) and 0 <= video.min() and video.max() <= 1
    torch.testing.assert_close(video, pipe_call(pipe, policy, 4, 4.0, output_type="pt", **extra), atol=1e-5,
                               rtol=1e-5)
    if extra:  # guidance_scale_2 matters: the low-noise steps guided at 4.0 give another sample
        assert (ode_sample(wan(wan_dirs[name]), 4, 4.0) - ours).abs().max() > 1e-4


def test_generate_steps_the_folders_unipc_as_the_pipeline(wan_dirs):
    """Validation, evaluate and predict (``generate``) give the pipeline's video for a UniPC folder (Wan 2.2 as
    published, flow_shift 12, boundary 0.875); flowrl's Euler ODE on the same grid gives another one."""
    policy = wan(wan_dirs["wan22"], guidance_scale_2=2.0)
    pipe = WanPipeline.from_pretrained(wan_dirs["wan22"])
    assert type(policy.solver()).__name__ == "UniPCMultistepScheduler" and policy.solver() is not policy.solver()
    assert wan(wan_dirs["wan22_euler"]).solver() is None  # Euler folders keep flowrl's ODE step, the same step
    want = pipe_call(pipe, policy, 6, 4.0, output_type="latent", guidance_scale_2=2.0)
    cond = policy.encode(PROMPTS)
    velocity = lambda z, sigma, rows: policy.velocity(z, sigma, cond.select(rows), 4.0)  # noqa: E731
    ours = solver_sample(velocity, SEEDS, policy.sigmas(6), policy.latent_shape(), policy.solver())
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)
    assert (ode_sample(policy, 6, 4.0) - want).abs().max() > 1e-2  # Euler on UniPC's grid: what flowrl did before
    # twice: a fresh solver each time
    video = FlowGRPO(policy, guidance_scale=4.0).generation.generate(PROMPTS, SEEDS, 6)
    torch.testing.assert_close(FlowGRPO(policy, guidance_scale=4.0).generation.generate(PROMPTS, SEEDS, 6), video)
    torch.testing.assert_close(video, pipe_call(pipe, policy, 6, 4.0, output_type="pt", guidance_scale_2=2.0),
                               atol=1e-5, rtol=1e-5)


def test_ti2v_5b_shape_48_channel_vae_and_per_token_timesteps_match_the_pipeline(wan_dirs):
    policy = wan(wan_dirs["ti2v"], height=64, width=64)
    pipe = WanPipeline.from_pretrained(wan_dirs["ti2v"])
    assert policy.expand_timesteps and policy.latent_shape() == (48, 3, 4, 4)  # 64 px / 16, 48 channels
    cond = policy.encode(PROMPTS)
    velocity = lambda z, sigma, rows: policy.velocity(z, sigma, cond.select(rows), 4.0)  # noqa: E731
    latents, _ = sample(velocity, SEEDS, policy.sigmas(3), policy.latent_shape(), "ode")
    noise = seeded_noise(SEEDS, policy.latent_shape(), 1)[:, 0]
    kw = dict(negative_prompt="", height=64, width=64, num_frames=FRAMES, num_inference_steps=3, guidance_scale=4.0,
              latents=noise, max_sequence_length=16)
    torch.testing.assert_close(latents[:, -1], pipe(PROMPTS, output_type="latent", **kw).frames, atol=1e-5,
                               rtol=1e-5)
    video = policy.decode(latents[:, -1])
    assert video.shape == (2, FRAMES, 3, 64, 64)
    torch.testing.assert_close(video, pipe(PROMPTS, output_type="pt", **kw).frames, atol=1e-5, rtol=1e-5)


def record_experts(policy_or_pipe):
    """Which expert ran each call (0: transformer, 1: transformer_2), in order."""
    calls = []
    for index, module in enumerate((policy_or_pipe.transformer, policy_or_pipe.transformer_2)):
        module.register_forward_hook(lambda m, args, kwargs, out, i=index: calls.append(i), with_kwargs=True)
    return calls


def test_wan22_switches_experts_at_the_pipelines_step(wan_dirs):
    policy = wan(wan_dirs["wan22"])
    pipe = WanPipeline.from_pretrained(wan_dirs["wan22"])
    theirs = record_experts(pipe)
    pipe_call(pipe, policy, 6, 4.0, output_type="latent")
    ours = record_experts(policy.denoiser)
    ode_sample(policy, 6, 4.0)
    per_step = theirs[::2]  # the pipeline calls one expert twice per step (conditional, unconditional)
    assert theirs[1::2] == per_step and 0 < sum(per_step) < 6  # the switch falls inside the schedule
    assert ours == per_step  # flowrl: one CFG batch per step, through the same expert
    # the boundary itself: t = 875 is still the high-noise expert's, t = 874.9 the low-noise one's
    assert policy.denoiser.expert_index(torch.tensor([875.0, 874.9])).tolist() == [0, 1]


def test_rows_at_different_steps_each_use_their_expert(wan_dirs):
    policy = wan(wan_dirs["wan22"])
    cond = policy.encode(PROMPTS)
    sigmas = policy.sigmas(6)
    z = torch.randn(2, *policy.latent_shape())
    high, low = sigmas[0], sigmas[5]
    with torch.no_grad():
        mixed = policy.velocity(z, torch.stack([high, low]), cond, 3.0)
        alone = [policy.velocity(z[i:i + 1], s[None], cond.select([i]), 3.0) for i, s in enumerate((high, low))]
    assert policy.denoiser.expert_index(policy.timesteps(torch.stack([high, low]))).tolist() == [0, 1]
    torch.testing.assert_close(mixed, torch.cat(alone), atol=1e-5, rtol=1e-5)


def test_lora_on_one_expert_and_full_finetuning_of_one(wan_dirs):
    low = wan(wan_dirs["wan22"], trained_experts=["transformer_2"])
    names = [n for n, p in low.named_parameters() if p.requires_grad]
    assert names and all(n.startswith("denoiser.transformer_2.") and "lora_" in n for n in names)
    assert not any("lora_" in n for n, _ in low.denoiser.transformer.named_parameters())
    both = wan(wan_dirs["wan22"])
    assert {n.split(".")[1] for n, p in both.named_parameters() if p.requires_grad} == {"transformer",
                                                                                        "transformer_2"}
    full = wan(wan_dirs["wan22"], lora=None, trained_experts=["transformer"])
    assert all(p.requires_grad for p in full.denoiser.transformer.parameters())
    assert not any(p.requires_grad for p in full.denoiser.transformer_2.parameters())
    assert set(full.state_dict()) == {f"denoiser.transformer.{n}" for n, _ in
                                      full.denoiser.transformer.named_parameters()}  # checkpoints: trained only


def test_a_training_pass_on_the_frozen_experts_rows_alone_has_a_backward_of_zeros(wan_dirs):
    policy = wan(wan_dirs["wan22"], trained_experts=["transformer"])
    sigma = policy.sigmas(6)[[4, 5]]  # both rows on the low-noise expert, which does not train
    assert policy.denoiser.expert_index(policy.timesteps(sigma)).tolist() == [1, 1]
    z, cond = torch.randn(2, *policy.latent_shape()), policy.encode(PROMPTS)
    policy.velocity(z, sigma, cond, 3.0).square().mean().backward()  # a PPO micro-batch of such rows
    assert all(p.grad is not None and not p.grad.any() for p in policy.trainable_parameters())


def test_reference_is_the_backbone_for_both_experts(wan_dirs):
    policy = wan(wan_dirs["wan22"])
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.1)
    cond, z, sigma = policy.encode(PROMPTS), torch.randn(2, *policy.latent_shape()), policy.sigmas(6)[[0, 5]]
    base = wan(wan_dirs["wan22"])  # LoRA B starts at zero: the backbone's output
    base.sigmas(6)
    with torch.no_grad():
        trained = policy.velocity(z, sigma, cond, 3.0)
        with policy.reference():
            reference = policy.velocity(z, sigma, cond, 3.0)
        want = base.velocity(z, sigma, cond, 3.0)
    assert (trained - want).abs().max() > 1e-3
    torch.testing.assert_close(reference, want)


def test_gradient_checkpointing_per_block_gives_the_same_gradients(wan_dirs):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation (peft draws it)
        policy = wan(wan_dirs["wan22"], gradient_checkpointing=checkpointing)
        assert all(m.gradient_checkpointing == checkpointing for m in policy.denoiser.experts())
        z, cond = torch.randn(2, *policy.latent_shape()), policy.encode(PROMPTS)
        with torch.no_grad():
            for p in policy.trainable_parameters():
                p.add_(0.01 * torch.randn_like(p))
        policy.train()
        policy.velocity(z, policy.sigmas(6)[[0, 5]], cond, 3.0).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1])


def test_mixed_precision_keeps_trained_weights_and_velocities_in_float32(wan_dirs):
    policy = wan(wan_dirs["wan22"], torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    reference = wan(wan_dirs["wan22"])
    assert policy.text_encoder.dtype == torch.bfloat16 and policy.vae.dtype == torch.float32  # VAE: as diffusers
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}
    z, sigma = torch.randn(2, *policy.latent_shape()), policy.sigmas(6)[[0, 5]]  # one row on each expert
    reference.sigmas(6)
    policy.train()
    out = policy.velocity(z, sigma, policy.encode(PROMPTS), 2.0)
    out.square().mean().backward()  # through gradient checkpointing
    with torch.no_grad():
        want = reference.velocity(z, sigma, reference.encode(PROMPTS), 2.0)
    assert out.dtype == torch.float32
    assert (out - want).abs().max() < 0.05 * want.abs().max()  # bf16 weights and compute: ~1e-2 relative
    assert all(p.grad is not None for p in policy.trainable_parameters())  # both experts' adapters


@pytest.mark.parametrize("option, message", [
    ({"height": 40}, "policy.height=40 must be a positive multiple of 16"),
    ({"num_frames": 8}, r"policy.num_frames=8 must be 1 \+ a multiple of 4 .* e.g. 5 or 9"),
    ({"guidance_scale_2": 3.0}, "needs Wan 2.2's second expert"),
    ({"trained_experts": ["transformer_3"]}, "policy.trained_experts names"),
    ({"flow_shift": 0.0}, "policy.flow_shift=0.0 must be > 0"),
])
def test_bad_options_fail_before_any_weight_loads(wan_dirs, monkeypatch, option, message):
    from diffusers import WanTransformer3DModel

    from diffusers import AutoencoderKLWan

    for cls in (WanTransformer3DModel, AutoencoderKLWan):
        monkeypatch.setattr(cls, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ValueError, match=message):
        wan(wan_dirs["wan21"], **option)


def test_collective_forwards_run_both_experts_and_leave_the_output_unchanged(wan_dirs):
    policy = wan(wan_dirs["wan22"])
    calls = record_experts(policy.denoiser)
    t = torch.tensor([999.0, 990.0])  # both rows on the high-noise expert
    z, embeds = torch.randn(2, *policy.latent_shape()), policy.encode(PROMPTS).embeds
    expert = policy.denoiser.expert_index(t)
    alone = policy.denoiser(z, t, embeds, expert=expert)
    assert calls == [0]
    both = policy.denoiser(z, t, embeds, expert=expert, collective=True)  # FSDP2: every rank calls every expert
    assert calls == [0, 0, 1]
    torch.testing.assert_close(both, alone)
    both.square().sum().backward()  # the idle expert's backward runs too (zero gradients), as its collectives need
    idle = [p.grad for n, p in policy.denoiser.transformer_2.named_parameters() if p.requires_grad]
    assert idle and all(g is not None and g.abs().sum() == 0 for g in idle)
