"""Export of Wan policies for diffusers: each trained expert's LoRA file loads into the plain WanPipeline with
``load_lora_weights`` (Wan 2.2's low-noise expert with ``load_into_transformer_2``) and reproduces the adapter's ODE
video; the merged pipeline loads with ``from_pretrained``; LoRA weights load back onto a policy; the same for
image-to-video (``WanImageToVideoPipeline``, LoRA on the image tokens' attention included)."""

import torch
from diffusers import WanPipeline

from flowrl.methods import FlowGRPO
from flowrl.policies.export import export_lora, export_pipeline, load_lora
from tests.policies.test_wan import PROMPTS, SEEDS, pipe_call, wan

STEPS, GUIDANCE = 3, 4.0
SECOND = "pytorch_lora_weights_transformer_2.safetensors"


def trained(path, **kw):
    policy = wan(path, **kw)
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    return policy


def load_exported(pipe, folder):
    if (folder / "pytorch_lora_weights.safetensors").is_file():
        pipe.load_lora_weights(folder)
    if (folder / SECOND).is_file():
        pipe.load_lora_weights(folder, weight_name=SECOND, load_into_transformer_2=True)
    return pipe


def test_both_experts_lora_and_merged_pipeline_reproduce_the_adapters_ode_video(wan_dirs, tmp_path):
    path = wan_dirs["wan22_euler"]
    policy = trained(path)
    ours = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.generate(PROMPTS, SEEDS, STEPS)
    export_lora(policy, tmp_path / "lora")
    assert sorted(p.name for p in (tmp_path / "lora").iterdir()) == ["pytorch_lora_weights.safetensors", SECOND]
    base = pipe_call(WanPipeline.from_pretrained(path), policy, STEPS, GUIDANCE, output_type="pt")
    assert (base - ours).abs().max() > 1e-3  # the LoRA matters, so the match below is the LoRA's
    with_lora = pipe_call(load_exported(WanPipeline.from_pretrained(path), tmp_path / "lora"), policy, STEPS,
                          GUIDANCE, output_type="pt")
    torch.testing.assert_close(with_lora, ours, atol=1e-5, rtol=1e-4)
    fresh = wan(path)
    load_lora(fresh, tmp_path / "lora")
    again = FlowGRPO(fresh, guidance_scale=GUIDANCE).generation.generate(PROMPTS, SEEDS, STEPS)
    torch.testing.assert_close(again, ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = pipe_call(WanPipeline.from_pretrained(tmp_path / "merged"), policy, STEPS, GUIDANCE, output_type="pt")
    torch.testing.assert_close(merged, ours, atol=1e-5, rtol=1e-4)


def test_one_trained_expert_exports_its_file_only(wan_dirs, tmp_path):
    path = wan_dirs["wan22_euler"]
    policy = trained(path, trained_experts=["transformer_2"])
    ours = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.generate(PROMPTS, SEEDS, STEPS)
    export_lora(policy, tmp_path / "lora")
    assert [p.name for p in (tmp_path / "lora").iterdir()] == [SECOND]
    with_lora = pipe_call(load_exported(WanPipeline.from_pretrained(path), tmp_path / "lora"), policy, STEPS,
                          GUIDANCE, output_type="pt")
    torch.testing.assert_close(with_lora, ours, atol=1e-5, rtol=1e-4)


def test_full_finetuning_exports_the_whole_pipeline(wan_dirs, tmp_path):
    policy = trained(wan_dirs["wan21"], lora=None)
    export_pipeline(policy, tmp_path / "full")
    loaded = WanPipeline.from_pretrained(tmp_path / "full").transformer.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in policy.denoiser.transformer.state_dict().items())


def test_export_command_from_a_two_expert_fit_checkpoint(wan_dirs, tmp_path):
    from pathlib import Path

    from peft.utils import get_peft_model_state_dict

    from flowrl.cli import main
    from tests.policies.test_wan_fit import ROOT, tiny_overlay

    out = tmp_path / "run"
    out.mkdir()
    main(["fit", "--config", str(ROOT / "configs/wan22_flow_grpo.yaml"),
          "--config", str(tiny_overlay(out, wan_dirs["wan22"], "wan22_flow_grpo")),
          "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
          "--trainer.callbacks.every_n_train_steps=2"])  # the config validates by steps: no epoch-end save
    ckpt = next(Path(out).rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "lora")])
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    pipe = load_exported(WanPipeline.from_pretrained(wan_dirs["wan22"]), tmp_path / "lora")
    for expert in ("transformer", "transformer_2"):
        want = {k[len(f"policy.denoiser.{expert}."):].replace(".default", ""): v for k, v in saved.items()
                if k.startswith(f"policy.denoiser.{expert}.") and "lora_" in k}
        loaded = get_peft_model_state_dict(getattr(pipe, expert), adapter_name="default_0")
        assert want and sorted(loaded) == sorted(want) and all(torch.equal(loaded[k], want[k]) for k in want)


def test_image_to_video_lora_and_merged_pipeline_reproduce_the_adapters_ode_sample(wan_dirs, tmp_path):
    from diffusers import WanImageToVideoPipeline

    from flowrl.rewards.pil_images import to_pil
    from flowrl.sampling.sampler import sample, seeded_noise
    from tests.policies.test_wan_i2v import first_frames, i2v
    from tests.policies.tiny_wan import FRAMES, SIZE

    path = wan_dirs["wan21_i2v"]
    policy = i2v(path)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    # LoRA on the image tokens' attention too (add_k_proj, add_v_proj: Wan 2.1 I2V's CLIP cross-attention)
    assert any(".add_k_proj.lora_" in n for n, _ in policy.named_parameters())
    frame = first_frames(1)[0]
    cond = policy.encode(PROMPTS, images=[[frame], [frame]])
    velocity = lambda z, sigma, rows: policy.velocity(z, sigma, cond.select(rows), GUIDANCE)  # noqa: E731
    ours = sample(velocity, SEEDS, policy.sigmas(STEPS), policy.latent_shape(), "ode")[0][:, -1]
    noise = seeded_noise(SEEDS, policy.latent_shape(), 1)[:, 0]

    def pipeline_sample(pipe):  # the adapter's prompt embeddings: the I2V pipeline's encode_prompt needs ftfy
        return pipe(image=to_pil(frame[None])[0], prompt_embeds=cond.embeds, negative_prompt_embeds=cond.null_embeds,
                    height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                    latents=noise, output_type="latent").frames

    assert (pipeline_sample(WanImageToVideoPipeline.from_pretrained(path)) - ours).abs().max() > 1e-3
    export_lora(policy, tmp_path / "lora")
    assert [p.name for p in (tmp_path / "lora").iterdir()] == ["pytorch_lora_weights.safetensors"]
    with_lora = load_exported(WanImageToVideoPipeline.from_pretrained(path), tmp_path / "lora")
    assert any(".add_k_proj.lora_" in n for n, _ in with_lora.transformer.named_parameters())
    torch.testing.assert_close(pipeline_sample(with_lora), ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = WanImageToVideoPipeline.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(pipeline_sample(merged), ours, atol=1e-5, rtol=1e-4)
