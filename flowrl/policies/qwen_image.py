"""Qwen-Image (arXiv 2508.02324) on the components of diffusers' ``QwenImagePipeline``.

``QwenImageTransformer2DModel`` (an MMDiT, 60 blocks in the 20B model) works on 2x2-packed latents, with the image
shape passed for its RoPE; the sampler sees plain ``[C, h, w]`` latents and the packing stays inside ``_forward``
(the pipeline's own ``_pack_latents`` / ``_unpack_latents``). A prompt is the last hidden states of Qwen2.5-VL-7B
under the pipeline's chat template, without the template's 34 system-prefix tokens, so prompts differ in length:
each batch is padded and masked (``PaddedPromptPolicy``), and the mask reaches the transformer's joint attention as
the pipeline passes it (None when every token of the batch is real).

Guidance is the pipeline's "true CFG" on a negative prompt, followed by its norm-preserving rescale: each image
token's combined velocity is scaled to the norm of its conditional velocity (:meth:`QwenImagePolicy.guide`). The
VAE is Wan's 3D causal one (a frame axis of 1 here) with per-channel ``latents_mean`` / ``latents_std``. The
scheduler shifts ``linspace(1, 1/T, T)`` by ``mu`` of the image's token count (and Qwen-Image's scheduler then
stretches the grid to a terminal sigma of 0.02).
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                       QwenImageTransformer2DModel)
from torch import Tensor
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import linear_grid, pipeline_sigmas, token_mu
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.padded_prompts import MASK, PaddedPromptPolicy, unpadded
from flowrl.policies.sd3 import resolution_problem

#: diffusers' examples/dreambooth/train_dreambooth_lora_qwen_image.py default: the attention projections of the image
#: stream (the text stream's add_*_proj and both MLPs stay frozen)
QWEN_IMAGE_LORA_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")
#: QwenImagePipeline.check_inputs: longer prompts are refused
MAX_SEQUENCE_LENGTH = 1024


def qwen_image_problems(resolution: int, vae_factor: int, max_sequence_length: int,
                        transformer_config: dict) -> list[str]:
    """The problems of Qwen-Image options, found from the configs before any weight loads.

    >>> qwen_image_problems(500, 8, 2048, {"guidance_embeds": False})  # doctest: +NORMALIZE_WHITESPACE
    ['policy.resolution=500 must be a positive multiple of 16 (VAE downsampling x transformer patch size), e.g. 496',
     'policy.max_sequence_length=2048 must be in [1, 1024] (QwenImagePipeline refuses more than 1024)']
    """
    problems = [p for p in [resolution_problem(resolution, vae_factor * 2)] if p]
    if not 1 <= max_sequence_length <= MAX_SEQUENCE_LENGTH:
        problems.append(f"policy.max_sequence_length={max_sequence_length} must be in [1, {MAX_SEQUENCE_LENGTH}] "
                        "(QwenImagePipeline refuses more than 1024)")
    if transformer_config.get("guidance_embeds"):
        problems.append("policy.model: this Qwen-Image transformer has guidance_embeds=true, which no released "
                        "text-to-image Qwen-Image uses and QwenImagePolicy does not drive; use a true-CFG model")
    return problems


class QwenImagePolicy(PaddedPromptPolicy):
    """Qwen-Image adapter (``Qwen/Qwen-Image``, ``Qwen/Qwen-Image-2512``).

    Args:
        model: hub id, local folder or embedded name of a ``QwenImagePipeline`` folder.
        lora: LoRA options (default targets: ``QWEN_IMAGE_LORA_TARGETS``, the default of diffusers'
            ``examples/dreambooth/train_dreambooth_lora_qwen_image.py``); None for full fine-tuning.
        resolution: image height and width in pixels (a multiple of 16).
        max_sequence_length: text tokens kept per prompt after the template prefix (at most 1024).
        negative_prompt: the unconditional side of true CFG (Flow-Factory and diffusers' examples use ``""``; the
            Qwen-Image model card ``" "``).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = QwenImagePipeline
    default_lora_targets = QWEN_IMAGE_LORA_TARGETS
    denoiser_kind = "QwenImageTransformer2DModel"
    #: the classes of the folder's ``vae`` and ``transformer`` (their configs are read before loading)
    vae_class, denoiser_class = AutoencoderKLQwenImage, QwenImageTransformer2DModel
    text_encoder_class = Qwen2_5_VLForConditionalGeneration

    def __init__(self, model: str = "Qwen/Qwen-Image", lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0),
                 resolution: int = 512, max_sequence_length: int = 512, negative_prompt: str = "",
                 torch_dtype: str = "float32", autocast: Optional[str] = None, gradient_checkpointing: bool = False,
                 vae_chunk_size: Optional[int] = None, prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.vae_config = component_config(self.vae_class, self.path, "vae")
        self.denoiser_config = component_config(self.denoiser_class, self.path, "transformer")
        self.resolution, self.max_sequence_length = resolution, max_sequence_length
        self.negative_prompt = negative_prompt
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")
        self.check_problems(qwen_image_problems(resolution, self.vae_scale_factor, max_sequence_length,
                                                self.denoiser_config))

    def _load_weights(self) -> None:
        path, dtype = self.path, self.torch_dtype
        self.vae = self.vae_class.from_pretrained(path, subfolder="vae", torch_dtype=dtype).eval()
        self._load_prompt_reader()
        self.text_encoder = self.text_encoder_class.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval()
        self.denoiser = self.denoiser_class.from_pretrained(path, subfolder="transformer",
                                                            torch_dtype=self.denoiser_dtype)

    def _load_prompt_reader(self) -> None:
        """What the pipeline's ``encode_prompt`` reads prompts with (Qwen-Image: the tokenizer)."""
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, subfolder="tokenizer")

    def components(self) -> dict:
        return dict(transformer=self.denoiser, scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
                    tokenizer=self.tokenizer)

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** len(self.vae_config["temperal_downsample"])  # as QwenImagePipeline

    def _encode_rows(self, prompts: list[str]) -> list[Tensor]:
        embeds, mask = self.pipeline().encode_prompt(prompt=prompts, device=self.text_encoder.device,
                                                     max_sequence_length=self.max_sequence_length)
        return unpadded(embeds, mask)

    def _pack(self, v: Tensor) -> Tensor:
        b, c, h, w = v.shape
        return self.pipeline_class._pack_latents(v, b, c, h, w)  # [B, h/2 * w/2, 4C]

    def _unpack(self, packed: Tensor, h: int, w: int) -> Tensor:
        f = self.vae_scale_factor
        return self.pipeline_class._unpack_latents(packed, h * f, w * f, f)[:, :, 0]  # [B, C, 1, h, w] -> frame 0

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        h, w = latents.shape[-2:]
        dtype, mask = self.denoiser_dtype, cond.extra[MASK]
        with self._autocast():
            out = self.denoiser(hidden_states=self._pack(latents.to(dtype)), timestep=sigma.to(dtype),
                                encoder_hidden_states=cond.embeds.to(dtype),
                                # the pipeline passes no mask when every token is real
                                encoder_hidden_states_mask=None if bool(mask.all()) else mask,
                                img_shapes=[[(1, h // 2, w // 2)]] * len(latents), return_dict=False)[0]
        return self._unpack(out.float(), h, w)

    def guide(self, v_uncond: Tensor, v_cond: Tensor, guidance_scale: float) -> Tensor:
        """True CFG, then each packed token (the ``4C`` values of a 2x2 patch) rescaled to its conditional norm, as
        ``QwenImagePipeline.__call__``: ``comb * ||v_c|| / ||comb||``."""
        combined = self._pack(super().guide(v_uncond, v_cond, guidance_scale))
        cond_norm = self._pack(v_cond).norm(dim=-1, keepdim=True)  # [B, tokens, 1]
        rescaled = combined * (cond_norm / combined.norm(dim=-1, keepdim=True))
        return self._unpack(rescaled, *v_cond.shape[-2:])

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[0, 1]``: latents un-normalised per channel (``latents_std``, then
        ``latents_mean``), decoded as one-frame videos, ``vae_chunk_size`` at a time."""
        cfg = self.vae.config
        mean = torch.tensor(cfg.latents_mean, device=latents.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, device=latents.device).view(1, -1, 1, 1, 1)
        # [n, C, 1, h, w] in, the one frame out
        return self.decode_chunks(latents, lambda z: (z[:, :, None] * std + mean).to(self.vae.dtype))[:, :, 0]

    def latent_shape(self) -> tuple[int, ...]:
        size = 2 * (self.resolution // (self.vae_scale_factor * 2))
        return (self.denoiser_config.in_channels // 4, size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as ``QwenImagePipeline``: ``linspace(1, 1/T, T)`` shifted by ``mu`` of the packed
        token count (and stretched to the scheduler's terminal sigma, if it has one), ending at 0."""
        size = self.latent_shape()[1]  # QwenImagePipeline reads no use_flow_sigmas: its grid is always linear
        return pipeline_sigmas(self.scheduler, num_steps, linear_grid(num_steps),
                               token_mu(self.scheduler.config, (size // 2) ** 2))
