"""The embedded text-to-image flow model: a tiny SD3 transformer on 16x16 RGB pixels, a tiny CLIP text encoder.

Trained by ``scripts/pretrain_tiny_model.py`` on digit canvases (``flowrl.digit_canvas``) and shipped in diffusers
folder layout under ``flowrl/assets/tiny-digits``; it loads through ``from_pretrained`` exactly like a hub model.
There is no VAE: latents are pixels in ``[-1, 1]``.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
from torch import Tensor
from transformers import AutoTokenizer, CLIPTextModelWithProjection

from flowrl.policies.base import Conditioning, FlowPolicy, LoraOptions
from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config

SD3_LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")


class TinyFlowPolicy(FlowPolicy):
    """Adapter for the embedded model (and any folder with the same four components).

    Args:
        model: ``flowrl/tiny-digits``, a local folder or a hub id with ``tokenizer/``, ``text_encoder/``,
            ``transformer/`` and ``scheduler/``.
        lora: LoRA options; ``null`` in YAML for full fine-tuning.
        activation_offload: keep what the training forward saves for its backward in host memory (see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`).
    """

    default_lora_targets = SD3_LORA_TARGETS
    denoiser_kind = "SD3Transformer2DModel"

    def __init__(self, model: str = "flowrl/tiny-digits", lora: Optional[LoraOptions] = LoraOptions(),
                 activation_offload: bool = False):
        super().__init__(lora=lora, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.denoiser_config = component_config(SD3Transformer2DModel, self.path, "transformer")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")
        self.tokenizer, self.text_encoder = None, None
        self._null: Optional[tuple[Tensor, Tensor]] = None

    def _load_weights(self) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, subfolder="tokenizer")
        self.text_encoder = CLIPTextModelWithProjection.from_pretrained(self.path, subfolder="text_encoder").eval()
        self.denoiser = SD3Transformer2DModel.from_pretrained(self.path, subfolder="transformer")

    @torch.no_grad()
    def _encode_text(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        tokens = self.tokenizer(prompts, padding="max_length", max_length=self.tokenizer.model_max_length,
                                truncation=True, return_tensors="pt").to(self.text_encoder.device)
        out = self.text_encoder(input_ids=tokens.input_ids)
        return out.last_hidden_state, out.text_embeds

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        self.check_images(images)
        embeds, pooled = self._encode_text(list(prompts))
        null_embeds, null_pooled = self._encode_text([""])
        n = len(prompts)
        return Conditioning(embeds, pooled, null_embeds.expand(n, -1, -1), null_pooled.expand(n, -1))

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        timestep = sigma * self.scheduler.config.num_train_timesteps
        return self.denoiser(hidden_states=latents, encoder_hidden_states=cond.embeds, pooled_projections=cond.pooled,
                             timestep=timestep, return_dict=False)[0]

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        return (latents.float() / 2 + 0.5).clamp(0, 1)

    def latent_shape(self) -> tuple[int, ...]:
        cfg = self.denoiser_config
        return (cfg.in_channels, cfg.sample_size, cfg.sample_size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` from the scheduler's own grid (shift included), ending at 0."""
        self.scheduler.set_timesteps(num_steps)
        return self.scheduler.sigmas.float().clone()
