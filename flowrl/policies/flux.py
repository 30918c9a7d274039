"""FLUX.1 on the components of diffusers' ``FluxPipeline``.

``FluxTransformer2DModel`` works on packed latents (2x2 patches as tokens) with per-token image ids and T5 text
ids; the sampler sees ordinary ``[C, h, w]`` latents and the packing stays inside ``_forward`` (the pipeline's own
``_pack_latents`` / ``_unpack_latents`` / ``_prepare_latent_image_ids``), so every method and sampler step runs
unchanged. FLUX.1-dev is guidance-distilled: there is no classifier-free guidance batch; the loop's
``guidance_scale`` is the transformer's ``guidance`` input (ignored by models without a guidance embedding, such
as FLUX.1-schnell). Its scheduler shifts the sigma grid by ``mu``, a function of the image's token count.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from torch import Tensor
from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import linear_grid, pipeline_sigmas, token_mu
from flowrl.policies.pipeline_policy import PipelinePolicy
from flowrl.policies.sd3 import resolution_problem

# diffusers' train_dreambooth_lora_flux.py defaults: attention of both block kinds and the double blocks' MLPs
FLUX_LORA_TARGETS = ("attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                     "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                     "ff_context.net.2")


class FluxPolicy(PipelinePolicy):
    """FLUX.1 adapter.

    Args:
        model: hub id (``black-forest-labs/FLUX.1-dev``), local folder or embedded name of a ``FluxPipeline`` folder.
        lora: LoRA options (default targets: attention and the double blocks' MLPs); None for full fine-tuning.
        resolution: image height and width in pixels.
        max_sequence_length: T5 tokens per prompt (512 for dev, 256 for schnell).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = FluxPipeline
    default_lora_targets = FLUX_LORA_TARGETS
    denoiser_kind = "FluxTransformer2DModel"

    def __init__(self, model: str = "black-forest-labs/FLUX.1-dev",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 max_sequence_length: int = 512, torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = None,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.resolution, self.max_sequence_length = resolution, max_sequence_length
        self.vae_config = component_config(AutoencoderKL, self.path, "vae")
        self.denoiser_config = component_config(FluxTransformer2DModel, self.path, "transformer")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")
        self.guidance_kind = "embedded" if self.denoiser_config.guidance_embeds else "none"  # [dev]; [schnell]
        # latents pack in 2x2 patches
        self.check_problems([p for p in [resolution_problem(resolution, self.vae_scale_factor * 2)] if p])

    def _load_weights(self) -> None:
        path, dtype = self.path, self.torch_dtype
        self.vae = AutoencoderKL.from_pretrained(path, subfolder="vae", torch_dtype=dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.tokenizer_2 = AutoTokenizer.from_pretrained(path, subfolder="tokenizer_2")
        self.text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval()
        self.text_encoder_2 = T5EncoderModel.from_pretrained(path, subfolder="text_encoder_2", dtype=dtype).eval()
        self.denoiser = FluxTransformer2DModel.from_pretrained(path, subfolder="transformer",
                                                               torch_dtype=self.denoiser_dtype)

    def components(self) -> dict:
        return dict(transformer=self.denoiser, scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
                    tokenizer=self.tokenizer, text_encoder_2=self.text_encoder_2, tokenizer_2=self.tokenizer_2)

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        embeds, pooled, _ = self.pipeline().encode_prompt(prompt=prompts, prompt_2=None, device=self.vae.device,
                                                          max_sequence_length=self.max_sequence_length)
        return embeds, pooled

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts only: guidance is embedded, there is no unconditional branch."""
        self.check_images(images)
        embeds, pooled = self._encoded(list(prompts))
        return Conditioning(embeds, pooled)

    def velocity(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 cfg_gradient: str = "both") -> Tensor:
        """Velocity ``[B, C, h, w]`` with ``guidance_scale`` as the distilled guidance input (one evaluation, so
        ``cfg_gradient`` has nothing to choose between)."""
        return self._forward(latents, sigma, cond, guidance_scale)

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 source: Optional[Tensor] = None, source_ids: Optional[Tensor] = None) -> Tensor:
        """One evaluation; ``source [B, N, 4C]`` and ``source_ids [N, 3]``: tokens appended after the image's (an
        edit's source, FLUX.1 Kontext), whose outputs are dropped."""
        b, c, h, w = latents.shape
        dtype, device = self.denoiser_dtype, latents.device
        packed = FluxPipeline._pack_latents(latents.to(dtype), b, c, h, w)  # [B, h/2 * w/2, 4C]
        image_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, device, dtype)
        if source is not None:
            packed = torch.cat([packed, source.to(dtype)], 1)
            image_ids = torch.cat([image_ids, source_ids.to(device, dtype)], 0)
        embeds, pooled = cond.embeds, cond.pooled
        text_ids = torch.zeros(embeds.shape[1], 3, device=device, dtype=dtype)
        guidance = None
        if self.denoiser.config.guidance_embeds:
            guidance = torch.full((b,), float(guidance_scale), device=device, dtype=torch.float32)
        with self._autocast():
            out = self.denoiser(hidden_states=packed, timestep=sigma.to(dtype), guidance=guidance,
                                pooled_projections=pooled.to(dtype), encoder_hidden_states=embeds.to(dtype),
                                txt_ids=text_ids, img_ids=image_ids, return_dict=False)[0]
        scale = self.vae_scale_factor
        return FluxPipeline._unpack_latents(out[:, :(h // 2) * (w // 2)], h * scale, w * scale, scale).float()

    def latent_shape(self) -> tuple[int, ...]:
        size = 2 * (self.resolution // (self.vae_scale_factor * 2))
        return (self.denoiser_config.in_channels // 4, size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as ``FluxPipeline``: ``linspace(1, 1/T, T)`` shifted by ``mu`` of the image's token
        count (dynamic shifting), ending at 0."""
        cfg, size = self.scheduler.config, self.latent_shape()[1]
        return pipeline_sigmas(self.scheduler, num_steps, linear_grid(num_steps, cfg), token_mu(cfg, (size // 2) ** 2))
