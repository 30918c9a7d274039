"""Export for the editing adapters: the LoRA written with the pipeline's ``save_lora_weights``, loaded into the plain
pipeline with ``load_lora_weights``, reproduces the adapter's ODE samples for the same noise and sources; the merged
pipeline (its processor included) loads with ``from_pretrained`` and does too."""

import pytest
import torch
from diffusers import FluxKontextPipeline, QwenImageEditPlusPipeline

from flowrl.methods import FlowGRPO
from flowrl.policies import FluxKontextPolicy, LoraOptions, QwenImageEditPolicy
from flowrl.policies.export import export_lora, export_pipeline
from flowrl.rewards.pil_images import to_pil
from tests.policies.pipeline_oracle import start_noise
from tests.policies.test_qwen_image_edit import tiny_sizes  # noqa: F401  (the fixture)
from tests.policies.tiny_editing import CONDITION_AREA, SOURCE_AREA, source_images

STEPS, GUIDANCE, SEEDS = 3, 3.0, torch.tensor([11, 12])
EDITS = ["make the cat blue", "remove the tree"]


def qwen_call(policy, row):
    c, h, w = policy.latent_shape()
    return {"negative_prompt": [" "], "true_cfg_scale": GUIDANCE,
            "latents": QwenImageEditPlusPipeline._pack_latents(start_noise(policy, SEEDS)[row:row + 1], 1, c, h, w)}


def kontext_call(policy, row):
    c, h, w = policy.latent_shape()
    return {"guidance_scale": GUIDANCE, "max_area": 32 * 32, "_auto_resize": False, "max_sequence_length": 16,
            "latents": FluxKontextPipeline._pack_latents(start_noise(policy, SEEDS)[row:row + 1], 1, c, h, w)}


# family: (adapter and its tiny sizes, plain pipeline, the pipeline call's family-specific arguments)
FAMILIES = {
    "qwen_edit": (lambda path: QwenImageEditPolicy(path, lora=LoraOptions(rank=4, alpha=8), resolution=32,
                                                   source_area=SOURCE_AREA, condition_area=CONDITION_AREA).load(),
                  QwenImageEditPlusPipeline, qwen_call),
    "kontext": (lambda path: FluxKontextPolicy(path, lora=LoraOptions(rank=4, alpha=8), resolution=32,
                                               source_area=32 * 32, max_sequence_length=16).load(),
                FluxKontextPipeline, kontext_call),
}


def images(pipe, family, policy, sources):
    """The pipeline's images of each edit, one call per row (Edit-Plus takes one prompt per call)."""
    pipe.set_progress_bar_config(disable=True)
    out = [pipe(image=to_pil(source[None])[0], prompt=[prompt], num_inference_steps=STEPS, height=32, width=32,
                output_type="pt", **FAMILIES[family][2](policy, row)).images
           for row, (prompt, source) in enumerate(zip(EDITS, sources))]
    return torch.cat(out)


@pytest.fixture
def model_dir(request, qwen_edit_plus_dir, flux_kontext_dir):
    return {"qwen_edit": qwen_edit_plus_dir, "kontext": flux_kontext_dir}[request.param]


@pytest.mark.parametrize("family,model_dir", [(f, f) for f in FAMILIES], indirect=["model_dir"])
def test_exported_lora_and_merged_pipeline_reproduce_the_adapters_edits(family, model_dir, tmp_path, tiny_sizes):
    policy = FAMILIES[family][0](model_dir)
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    sources = source_images(2, size=(3, 32, 32))  # at the source size already: the pipelines keep them as given
    generation = FlowGRPO(policy, guidance_scale=GUIDANCE).generation
    ours = generation.generate(EDITS, SEEDS, STEPS, images=[[s] for s in sources])
    export_lora(policy, tmp_path / "lora")
    pipeline_class = FAMILIES[family][1]
    pipe = pipeline_class.from_pretrained(model_dir)
    base = images(pipe, family, policy, sources)
    pipe.load_lora_weights(tmp_path / "lora")
    assert (base - ours).abs().max() > 1e-3  # the LoRA matters, so the match below is the LoRA's
    torch.testing.assert_close(images(pipe, family, policy, sources), ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = images(pipeline_class.from_pretrained(tmp_path / "merged"), family, policy, sources)
    torch.testing.assert_close(merged, ours, atol=1e-5, rtol=1e-4)
