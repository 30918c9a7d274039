"""Stable Diffusion 3 / 3.5 (arXiv 2403.03206) on the components of diffusers' ``StableDiffusion3Pipeline``.

Transformer ``SD3Transformer2DModel`` (velocity of the rectified flow), two CLIP text encoders and an optional T5
(without it the T5 part of the prompt embedding is zeros, as diffusers does when ``text_encoder_3`` is None),
``AutoencoderKL`` with SD3's shift and scaling factors, and ``FlowMatchEulerDiscreteScheduler`` whose shift (3.0
for SD3.5) sets the sigma grid. Classifier-free guidance batches the empty prompt with the prompts (the base class).
"""

from __future__ import annotations

from typing import Optional

from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from torch import Tensor
from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import SD3_MAX_SHIFT, pipeline_sigmas, token_mu
from flowrl.policies.pipeline_policy import PipelinePolicy
from flowrl.policies.tiny import SD3_LORA_TARGETS


def resolution_problem(resolution: int, multiple: int) -> Optional[str]:
    """The error for an image size the latent grid cannot hold, or None.

    >>> resolution_problem(500, 16)
    'policy.resolution=500 must be a positive multiple of 16 (VAE downsampling x transformer patch size), e.g. 496'
    """
    if resolution > 0 and resolution % multiple == 0:
        return None
    return (f"policy.resolution={resolution} must be a positive multiple of {multiple} (VAE downsampling x "
            f"transformer patch size), e.g. {max(multiple, resolution // multiple * multiple)}")


class SD3Policy(PipelinePolicy):
    """SD3 / SD3.5 adapter.

    Args:
        model: hub id (``stabilityai/stable-diffusion-3.5-medium``), local folder or embedded name of a
            ``StableDiffusion3Pipeline`` folder.
        lora: LoRA options (default targets: the joint-attention projections); None for full fine-tuning.
        resolution: image height and width in pixels.
        text_encoder_3: load the T5 encoder (False saves ~9 GB in bf16; its embedding part is then zeros).
        max_sequence_length: T5 tokens per prompt.
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = StableDiffusion3Pipeline
    default_lora_targets = SD3_LORA_TARGETS
    denoiser_kind = "SD3Transformer2DModel"

    def __init__(self, model: str = "stabilityai/stable-diffusion-3.5-medium",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 text_encoder_3: bool = True, max_sequence_length: int = 256, torch_dtype: str = "float32",
                 autocast: Optional[str] = None, gradient_checkpointing: bool = False,
                 vae_chunk_size: Optional[int] = None, prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.resolution, self.max_sequence_length = resolution, max_sequence_length
        self.text_encoder_3_enabled = text_encoder_3
        self.vae_config = component_config(AutoencoderKL, self.path, "vae")
        self.denoiser_config = component_config(SD3Transformer2DModel, self.path, "transformer")
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")
        self.check_problems([p for p in [resolution_problem(
            resolution, self.vae_scale_factor * self.denoiser_config.patch_size)] if p])

    def _load_weights(self) -> None:
        path, dtype = self.path, self.torch_dtype
        self.vae = AutoencoderKL.from_pretrained(path, subfolder="vae", torch_dtype=dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.tokenizer_2 = AutoTokenizer.from_pretrained(path, subfolder="tokenizer_2")
        self.text_encoder = CLIPTextModelWithProjection.from_pretrained(
            path, subfolder="text_encoder", dtype=dtype).eval()
        self.text_encoder_2 = CLIPTextModelWithProjection.from_pretrained(
            path, subfolder="text_encoder_2", dtype=dtype).eval()
        three = self.text_encoder_3_enabled
        self.tokenizer_3 = AutoTokenizer.from_pretrained(path, subfolder="tokenizer_3") if three else None
        self.text_encoder_3 = T5EncoderModel.from_pretrained(
            path, subfolder="text_encoder_3", dtype=dtype).eval() if three else None
        self.denoiser = SD3Transformer2DModel.from_pretrained(path, subfolder="transformer",
                                                              torch_dtype=self.denoiser_dtype)

    def components(self) -> dict:
        return dict(transformer=self.denoiser, scheduler=self.scheduler, vae=self.vae,
                    text_encoder=self.text_encoder, tokenizer=self.tokenizer, text_encoder_2=self.text_encoder_2,
                    tokenizer_2=self.tokenizer_2, text_encoder_3=self.text_encoder_3, tokenizer_3=self.tokenizer_3)

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        embeds, _, pooled, _ = self.pipeline().encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.text_encoder.device,
            do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length)
        return embeds, pooled

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        dtype = self.denoiser_dtype
        with self._autocast():
            out = self.denoiser(hidden_states=latents.to(dtype), encoder_hidden_states=cond.embeds.to(dtype),
                                pooled_projections=cond.pooled.to(dtype),
                                timestep=sigma * self.scheduler.config.num_train_timesteps, return_dict=False)[0]
        return out.float()

    def latent_shape(self) -> tuple[int, ...]:
        size = self.resolution // self.vae_scale_factor
        return (self.denoiser_config.in_channels, size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 from the scheduler's own grid and shift (dynamic shift if configured), ending at 0."""
        cfg, mu = self.scheduler.config, None
        if cfg.get("use_dynamic_shifting"):  # StableDiffusion3Pipeline computes mu only then
            mu = token_mu(cfg, (self.latent_shape()[1] // self.denoiser_config.patch_size) ** 2, SD3_MAX_SHIFT)
        return pipeline_sigmas(self.scheduler, num_steps, mu=mu)
