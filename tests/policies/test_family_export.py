"""Export for the Qwen-Image, FLUX.2 and Z-Image adapters: the LoRA written with the pipeline's
``save_lora_weights``, loaded into the plain pipeline with ``load_lora_weights``, reproduces the adapter's ODE
samples; the merged pipeline loads with ``from_pretrained`` and does too."""

import pytest
import torch
from diffusers import Flux2KleinPipeline, QwenImagePipeline, ZImagePipeline

from flowrl.methods import FlowGRPO
from flowrl.policies import Flux2Policy, LoraOptions, QwenImagePolicy, ZImagePolicy
from flowrl.policies.export import export_lora, export_pipeline
from tests.policies.pipeline_oracle import PROMPTS, SEEDS, start_noise

STEPS, GUIDANCE = 3, 3.0


def qwen_call(policy):
    c, h, w = policy.latent_shape()
    return {"negative_prompt": [""] * len(PROMPTS), "true_cfg_scale": GUIDANCE, "max_sequence_length": 16,
            "latents": QwenImagePipeline._pack_latents(start_noise(policy), len(PROMPTS), c, h, w)}


# family: (adapter, plain pipeline, the pipeline call's family-specific arguments for flowrl's guidance GUIDANCE)
FAMILIES = {
    "qwen_image": (QwenImagePolicy, QwenImagePipeline, qwen_call),
    "flux2": (Flux2Policy, Flux2KleinPipeline, lambda policy: {"guidance_scale": GUIDANCE, "max_sequence_length": 16,
                                                               "latents": start_noise(policy)}),
    # Z-Image's g is flowrl's w - 1
    "zimage": (ZImagePolicy, ZImagePipeline, lambda policy: {"guidance_scale": GUIDANCE - 1, "max_sequence_length": 16,
                                                             "latents": start_noise(policy)}),
}


def images(pipe, family, policy):
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt=list(PROMPTS), num_inference_steps=STEPS, height=32, width=32, output_type="pt",
                **FAMILIES[family][2](policy)).images


@pytest.fixture
def model_dir(request, qwen_image_dir, flux2_dir, zimage_dir):
    return {"qwen_image": qwen_image_dir, "flux2": flux2_dir, "zimage": zimage_dir}[request.param]


@pytest.mark.parametrize("family,model_dir", [(f, f) for f in FAMILIES], indirect=["model_dir"])
def test_exported_lora_and_merged_pipeline_reproduce_the_adapters_ode_sample(family, model_dir, tmp_path):
    policy_class, pipeline_class, _ = FAMILIES[family]
    policy = policy_class(model_dir, lora=LoraOptions(rank=4, alpha=8), resolution=32, max_sequence_length=16).load()
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    ours = FlowGRPO(policy, guidance_scale=GUIDANCE).generation.generate(PROMPTS, SEEDS, STEPS)
    export_lora(policy, tmp_path / "lora")
    pipe = pipeline_class.from_pretrained(model_dir)
    base = images(pipe, family, policy)
    pipe.load_lora_weights(tmp_path / "lora")
    assert (base - ours).abs().max() > 1e-3  # the LoRA matters, so the match below is the LoRA's
    torch.testing.assert_close(images(pipe, family, policy), ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = images(pipeline_class.from_pretrained(tmp_path / "merged"), family, policy)
    torch.testing.assert_close(merged, ours, atol=1e-5, rtol=1e-4)
