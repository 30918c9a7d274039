"""FLUX.1 Kontext (arXiv 2506.15742) on the components of diffusers' ``FluxKontextPipeline``: FLUX.1's transformer
edits an image given as context tokens.

Each prompt record's source image is resized as the pipeline resizes it (``source_area`` null: to the closest aspect
ratio among ``PREFERRED_KONTEXT_RESOLUTIONS``, the pipeline's ``_auto_resize``; a number: that many pixels at the
image's aspect ratio, as the pipeline sizes its output to ``max_area``), with sides rounded down to multiples of 16,
encoded through the VAE (the distribution's mode), shifted, scaled and 2x2-packed by the pipeline's own
``prepare_latents``: once per distinct image, kept in ``Conditioning.shared``
(:mod:`flowrl.policies.source_latents`). Every evaluation appends those tokens to the noisy image's, with position ids
whose first coordinate is 1 (the pipeline's ``image_ids``), and keeps the image's outputs only. Prompts, the
embedded guidance (FLUX.1 Kontext [dev] is guidance-distilled: ``guidance_scale`` is the transformer's input, one
evaluation, no unconditional side), the sigma grid (shifted by the output's token count alone, as the pipeline) and
decoding are FLUX.1's (:class:`~flowrl.policies.flux.FluxPolicy`).

Deviations: the output is ``resolution`` square (the pipeline rescales its output to ``max_area`` at the requested
aspect ratio); the pipeline's optional true CFG on a negative prompt and its IP-adapter are not driven.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import FluxKontextPipeline
from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS
from torch import Tensor

from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.flux import FLUX_LORA_TARGETS, FluxPolicy
from flowrl.policies.pipeline_policy import joined_problems
from flowrl.policies.sharding import is_sharded
from flowrl.policies.source_latents import SOURCE, SOURCE_GRID, SourceCache, by_layout, count_problem
from flowrl.rewards.pil_images import to_pil

#: diffusers' examples/dreambooth/train_dreambooth_lora_flux_kontext.py default: FLUX.1's, plus the single blocks' MLP
#: input ``proj_mlp``
FLUX_KONTEXT_LORA_TARGETS = (*FLUX_LORA_TARGETS, "proj_mlp")


def source_size(height: int, width: int, area: Optional[int], multiple: int) -> tuple[int, int]:
    """``(height, width)`` a source of that size is resized to: the preferred Kontext resolution closest in aspect
    ratio (``area`` None, the pipeline's ``_auto_resize``, given the size its image processor rounded down) or ``area`` pixels at its aspect ratio (the pipeline's
    ``max_area`` rule), each side rounded down to a multiple of ``multiple``.

    >>> source_size(480, 640, None, 16), source_size(480, 640, 256 * 256, 16)  # 4:3 -> (880, 1184); 221.7 x 295.6
    ((880, 1184), (208, 288))
    """
    ratio = width / height
    if area is None:
        _, width, height = min((abs(ratio - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
    else:
        width, height = round((area * ratio) ** 0.5), round((area / ratio) ** 0.5)
    return height // multiple * multiple, width // multiple * multiple


class FluxKontextPolicy(FluxPolicy):
    """FLUX.1 Kontext adapter: one source image per prompt.

    Args:
        model: hub id (``black-forest-labs/FLUX.1-Kontext-dev``), local folder or embedded name of a
            ``FluxKontextPipeline`` folder.
        lora: LoRA options (default targets: ``FLUX_KONTEXT_LORA_TARGETS``, the default of diffusers'
            ``examples/dreambooth/train_dreambooth_lora_flux_kontext.py``); None for full fine-tuning.
        resolution: the edited image's height and width in pixels.
        source_area: pixels the source is resized to at its aspect ratio (null: the closest of the pipeline's
            preferred Kontext resolutions, 672 to 1568 px a side; Flow-Factory's recipe: 384 x 384).
        max_sequence_length: T5 tokens per prompt (512).
        image_cache_size: source images whose latents are kept (LRU).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = FluxKontextPipeline
    default_lora_targets = FLUX_KONTEXT_LORA_TARGETS
    conditioning_images = 1

    def __init__(self, model: str = "black-forest-labs/FLUX.1-Kontext-dev",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 source_area: Optional[int] = None, max_sequence_length: int = 512, image_cache_size: int = 256,
                 torch_dtype: str = "float32", autocast: Optional[str] = None, gradient_checkpointing: bool = False,
                 vae_chunk_size: Optional[int] = None, prompt_cache_size: int = 1024, activation_offload: bool = False):
        problems = []
        if source_area is not None and source_area < 16 * 16:
            problems.append(f"policy.source_area={source_area} must be >= 256 (16 x 16 px: the VAE and the 2x2 "
                            "packing need 16 px sides), or null (the pipeline's preferred resolutions)")
        if image_cache_size < 0:
            problems.append(f"policy.image_cache_size={image_cache_size} must be >= 0 (0 disables the cache)")
        with joined_problems(problems):
            super().__init__(model=model, lora=lora, resolution=resolution, max_sequence_length=max_sequence_length,
                             torch_dtype=torch_dtype, autocast=autocast, gradient_checkpointing=gradient_checkpointing,
                             vae_chunk_size=vae_chunk_size, prompt_cache_size=prompt_cache_size,
                             activation_offload=activation_offload)
        self.source_area = source_area
        self.sources = SourceCache(image_cache_size)

    def components(self) -> dict:
        return {**super().components(), "image_encoder": None, "feature_extractor": None}

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts (FLUX.1's encoding: no unconditional side) and each row's source latents in ``shared``."""
        cond = super().encode(prompts, images)
        if problem := count_problem(images, self.conditioning_images, type(self).__name__):
            raise ValueError(f"{problem}: give each prompt record one image in its \"images\" list")
        cond.shared = self.sources.rows(images, self._encode_source, self.denoiser.device)
        return cond

    @torch.no_grad()
    def _encode_source(self, row: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The packed latents ``[N, 4C]`` and token grid ``[1, 2]`` of one source, through the pipeline's own resize,
        preprocessing and ``prepare_latents``."""
        pipe, factor = self.pipeline(), self.vae_scale_factor
        image = to_pil(row[0][None])[0]
        # the pipeline takes the aspect ratio after its image processor rounds the size down to its multiple (16 on
        # the published model): from the raw size, ~6% of sources between 256 and 1500 px get another resolution
        given = pipe.image_processor.get_default_height_width(image) if self.source_area is None else image.size[::-1]
        height, width = source_size(*given, self.source_area, factor * 2)
        resized = pipe.image_processor.resize(image, height, width)
        pixels = pipe.image_processor.preprocess(resized, height, width)
        channels = self.denoiser.config.in_channels // 4
        _, source, _, _ = pipe.prepare_latents(pixels, 1, channels, self.resolution, self.resolution, self.vae.dtype,
                                               self.vae.device, None, torch.zeros(1))
        return source[0].float(), torch.tensor([[height // factor // 2, width // factor // 2]])

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 source: Optional[Tensor] = None, source_ids: Optional[Tensor] = None) -> Tensor:
        def run(rows: Tensor, layout: list[tuple[int, int]]) -> Tensor:
            (h, w), = layout
            ids = FluxKontextPipeline._prepare_latent_image_ids(1, h, w, latents.device, torch.float32)
            ids[..., 0] = 1  # the source's ids: the image's, first coordinate 1 (the pipeline's image_ids)
            part = cond.select(rows)
            return super(FluxKontextPolicy, self)._forward(latents[rows], sigma[rows], part, guidance_scale,
                                                           part.shared[SOURCE][:, :h * w], ids)

        return by_layout(len(latents), cond.shared[SOURCE_GRID], run, is_sharded(self.denoiser))
