"""Z-Image (arXiv 2511.22699) on the components of diffusers' ``ZImagePipeline``: Z-Image, and Z-Image-Turbo as a
few-step student (its model card samples 9 steps without CFG: ``guidance_scale: 1`` here).

``ZImageTransformer2DModel`` is a single-stream DiT that takes *lists*: one ``[C, 1, h, w]`` latent and one
caption of its own length per sample (it patchifies and pads both itself). The sampler's plain ``[C, h, w]``
batch is unbound into that list inside ``_forward``, and each caption is cut back to its real tokens with the
mask of ``PaddedPromptPolicy`` (a caption is Qwen3's second-to-last hidden states under its chat template, real
tokens only). The network runs on reversed time: it takes ``t = 1 - sigma`` (computed as the pipeline does,
``(1000 - 1000 sigma) / 1000``) and predicts ``x0 - eps``, so the velocity ``dz/dsigma`` is its negation.

Guidance: ``ZImagePipeline`` combines ``pos + g (pos - neg)`` and runs CFG when ``g > 0``; that is flowrl's
``v_u + w (v_c - v_u)`` with ``w = g + 1``, so a Z-Image ``guidance_scale`` of 4 is flowrl's 5 and Z-Image-Turbo's
0 is flowrl's 1. ``cfg_normalization`` caps each sample's guided norm at that multiple of its conditional norm,
as the pipeline's option (0: off, the pipeline's default). The VAE is FLUX.1's ``AutoencoderKL`` (scaling and shift
factors); the sigma grid is ``torch.linspace(1, 1/T, T)`` through the scheduler's shift (static for Z-Image-Turbo).
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas
from torch import Tensor
from transformers import AutoTokenizer, Qwen3Model

from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import pipeline_sigmas, token_mu
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.padded_prompts import MASK, PaddedPromptPolicy
from flowrl.policies.sd3 import resolution_problem

#: diffusers' examples/dreambooth/train_dreambooth_lora_z_image.py default: the attention projections of every block
#: (Flow-Factory's z_image adapter adds the feed-forward w1/w2/w3)
Z_IMAGE_LORA_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")


def z_image_problems(resolution: int, vae_factor: int, max_sequence_length: int,
                     cfg_normalization: float) -> list[str]:
    """The problems of Z-Image options, found from the configs before any weight loads.

    >>> z_image_problems(520, 8, 0, -1.0)  # doctest: +NORMALIZE_WHITESPACE
    ['policy.resolution=520 must be a positive multiple of 16 (VAE downsampling x transformer patch size), e.g. 512',
     'policy.max_sequence_length=0 must be >= 1 (text tokens per prompt; the pipeline uses 512)',
     'policy.cfg_normalization=-1.0 must be >= 0 (0: off; the pipeline caps the guided norm at this multiple of the
      conditional one)']
    """
    problems = [p for p in [resolution_problem(resolution, vae_factor * 2)] if p]
    if max_sequence_length < 1:
        problems.append(f"policy.max_sequence_length={max_sequence_length} must be >= 1 (text tokens per prompt; the "
                        "pipeline uses 512)")
    if cfg_normalization < 0:
        problems.append(f"policy.cfg_normalization={cfg_normalization} must be >= 0 (0: off; the pipeline caps the "
                        "guided norm at this multiple of the conditional one)")
    return problems


class ZImagePolicy(PaddedPromptPolicy):
    """Z-Image adapter (``Tongyi-MAI/Z-Image``, ``Tongyi-MAI/Z-Image-Turbo``).

    Args:
        model: hub id, local folder or embedded name of a ``ZImagePipeline`` folder.
        lora: LoRA options (default targets: ``Z_IMAGE_LORA_TARGETS``, the default of diffusers'
            ``examples/dreambooth/train_dreambooth_lora_z_image.py``); None for full fine-tuning.
        resolution: image height and width in pixels (a multiple of 16).
        max_sequence_length: text tokens per prompt, chat template included (the pipeline truncates there).
        negative_prompt: the unconditional side of CFG (the pipeline's default is ``""``).
        cfg_normalization: cap each guided velocity's norm at this multiple of the conditional one (0: off).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = ZImagePipeline
    default_lora_targets = Z_IMAGE_LORA_TARGETS
    denoiser_kind = "ZImageTransformer2DModel"

    def __init__(self, model: str = "Tongyi-MAI/Z-Image",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 max_sequence_length: int = 512, negative_prompt: str = "", cfg_normalization: float = 0.0,
                 torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = None,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.vae_config = component_config(AutoencoderKL, self.path, "vae")
        self.denoiser_config = component_config(ZImageTransformer2DModel, self.path, "transformer")
        self.resolution, self.max_sequence_length = resolution, max_sequence_length
        self.negative_prompt, self.cfg_normalization = negative_prompt, cfg_normalization
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")
        self.check_problems(z_image_problems(resolution, self.vae_scale_factor, max_sequence_length,
                                             cfg_normalization))

    def _load_weights(self) -> None:
        path, dtype = self.path, self.torch_dtype
        self.vae = AutoencoderKL.from_pretrained(path, subfolder="vae", torch_dtype=dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.text_encoder = Qwen3Model.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval()
        self.denoiser = ZImageTransformer2DModel.from_pretrained(path, subfolder="transformer",
                                                                 torch_dtype=self.denoiser_dtype)

    def components(self) -> dict:
        return dict(transformer=self.denoiser, scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
                    tokenizer=self.tokenizer)

    def _encode_rows(self, prompts: list[str]) -> list[Tensor]:
        # a copy: ZImagePipeline._encode_prompt writes the chat-templated text back into the list it is given
        rows, _ = self.pipeline().encode_prompt(prompt=list(prompts), device=self.text_encoder.device,
                                                do_classifier_free_guidance=False,
                                                max_sequence_length=self.max_sequence_length)
        return rows

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        dtype = self.denoiser_dtype
        captions = [row[keep] for row, keep in zip(cond.embeds.to(dtype), cond.extra[MASK])]
        timestep = (1000 - sigma.float() * 1000) / 1000  # ZImagePipeline: (1000 - t) / 1000 with t = 1000 sigma
        with self._autocast():
            out = self.denoiser(list(latents.to(dtype).unsqueeze(2).unbind(0)), timestep.to(dtype), captions,
                                return_dict=False)[0]
        return -torch.stack([o.float() for o in out]).squeeze(2)  # the network predicts -v

    def guide(self, v_uncond: Tensor, v_cond: Tensor, guidance_scale: float) -> Tensor:
        """CFG, then (``cfg_normalization > 0``) each sample's norm capped at ``cfg_normalization`` times its
        conditional velocity's norm, as ``ZImagePipeline.__call__``."""
        guided = super().guide(v_uncond, v_cond, guidance_scale)
        if not self.cfg_normalization:
            return guided
        cap = self.cfg_normalization * v_cond.flatten(1).norm(dim=1)  # [B]
        norm = guided.flatten(1).norm(dim=1)
        scale = torch.where(norm > cap, cap / norm, torch.ones_like(norm))
        return guided * scale.view(-1, *[1] * (guided.dim() - 1))

    def latent_shape(self) -> tuple[int, ...]:
        size = 2 * (self.resolution // (self.vae_scale_factor * 2))
        return (self.denoiser_config.in_channels, size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as ``ZImagePipeline``: ``torch.linspace(1, 1/T, T)`` through the scheduler's shift
        (static, or dynamic with ``mu`` of the 2x2-patch token count), ending at 0."""
        size = self.latent_shape()[1]
        return pipeline_sigmas(self.scheduler, num_steps, get_default_z_image_sigmas(num_steps),
                               token_mu(self.scheduler.config, (size // 2) ** 2))
