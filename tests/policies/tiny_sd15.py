"""A tiny random-weight ``StableDiffusionPipeline`` (32 px images, UNet blocks (32, 64) with one layer each), built
from configs with an offline CLIP tokenizer and saved in diffusers layout, scheduler included as the hub ships it
(a PNDM config with SD1.5's betas), so ``SD15Policy`` loads it through ``from_pretrained`` like the published one."""

from __future__ import annotations

import json
from pathlib import Path

from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from transformers import CLIPTextModel

from tests.policies.tiny_pipelines import clip_config, clip_tokenizer, save_pipeline, vae

#: SD1.5's ``scheduler/scheduler_config.json`` on the hub (plus ``"clip_sample": false``, see :func:`save_sd15`).
SD15_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                      set_alpha_to_one=False, skip_prk_steps=True, steps_offset=1)


def sd15_components() -> dict:
    tokenizer = clip_tokenizer()
    return {
        "unet": UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
                                     out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                     attention_head_dim=8),
        "vae": vae(4, shift=None, scale=0.18215),
        "scheduler": PNDMScheduler(**SD15_SCHEDULER),
        "tokenizer": tokenizer,
        "text_encoder": CLIPTextModel(clip_config(tokenizer, 32)),
        "safety_checker": None, "feature_extractor": None, "requires_safety_checker": False,
    }


def save_sd15(out: Path) -> Path:
    """Saves the pipeline; its scheduler config gets the hub's ``"clip_sample": false``, a key PNDM does not take
    but a DDIM scheduler made from the config reads (its default, true, would clip x0 in latent space)."""
    save_pipeline(StableDiffusionPipeline, sd15_components, out)
    config = Path(out, "scheduler", "scheduler_config.json")
    config.write_text(json.dumps({**json.loads(config.read_text()), "clip_sample": False}, indent=2))
    return out
