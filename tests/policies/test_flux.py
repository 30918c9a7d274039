"""The FLUX.1 adapter on a tiny random-weight FluxPipeline loaded through from_pretrained."""

import numpy as np
import torch
from diffusers import FluxPipeline

from flowrl.cli import main
from flowrl.policies import FluxPolicy, LoraOptions
from tests.policies.test_sd3 import HERE, fit_args, metrics


def flux(path, **kw):
    return FluxPolicy(path, **{"lora": LoraOptions(rank=4, alpha=8), "resolution": 32, "max_sequence_length": 8,
                               **kw}).load()


def test_encoding_guidance_and_packing(flux_dir):
    policy = flux(flux_dir)
    pipe = FluxPipeline.from_pretrained(flux_dir)
    prompts = ["a red cat", "a blue dog"]
    want, want_pooled, _ = pipe.encode_prompt(prompts, None, max_sequence_length=8)
    cond = policy.encode(prompts)
    assert cond.null_embeds is None  # guidance-distilled: no unconditional branch
    torch.testing.assert_close(cond.embeds, want)
    torch.testing.assert_close(cond.pooled, want_pooled)
    assert policy.latent_shape() == (4, 16, 16)  # 16 packed channels / 4; 32 px / VAE factor 2
    z, sigma = torch.randn(2, 4, 16, 16), torch.tensor([0.8, 0.3])
    with torch.no_grad():
        v = policy.velocity(z, sigma, cond, 3.5)
        packed = FluxPipeline._pack_latents(z, 2, 4, 16, 16)  # the transformer called as the pipeline calls it
        direct = policy.denoiser(hidden_states=packed, timestep=sigma, guidance=torch.full((2,), 3.5),
                                 pooled_projections=cond.pooled, encoder_hidden_states=cond.embeds,
                                 txt_ids=torch.zeros(8, 3), img_ids=FluxPipeline._prepare_latent_image_ids(
                                     2, 8, 8, "cpu", torch.float32), return_dict=False)[0]
        other = policy.velocity(z, sigma, cond, 1.0)
    assert v.shape == z.shape
    torch.testing.assert_close(FluxPipeline._pack_latents(v, 2, 4, 16, 16), direct)
    assert not torch.allclose(v, other)  # the guidance input reaches the transformer


def test_sigmas_use_the_dynamic_shift(flux_dir):
    policy = flux(flux_dir)
    # 8x8 = 64 image tokens; mu = 0.5 + (64 - 16) (1.15 - 0.5) / (256 - 16) = 0.63 (the tiny scheduler's bounds)
    mu = 0.5 + (64 - 16) * (1.15 - 0.5) / (256 - 16)
    s = np.linspace(1.0, 1 / 4, 4)
    want = np.exp(mu) / (np.exp(mu) + (1 / s - 1))  # the exponential time shift, exponent 1
    torch.testing.assert_close(policy.sigmas(4), torch.tensor([*want, 0.0], dtype=torch.float32))


def test_fit_one_step_with_lora_and_full_finetuning_is_on_policy(flux_dir, tmp_path):
    for name, layers in (("lora", []), ("full", ["--config", str(HERE / "full_finetune.yaml")])):
        main(fit_args(flux_dir, tmp_path / name, *layers, "--model.init_args.guidance_scale=3.5",
                      policy="flowrl.policies.FluxPolicy"))
        logged = metrics(tmp_path / name)
        assert logged["train/check_ratio_max_dev"] < 1e-5, name
        assert np.isfinite(logged["train/loss"]), name
