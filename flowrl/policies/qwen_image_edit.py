"""Qwen-Image-Edit and Qwen-Image-Edit-Plus (2509, 2511) on the components of diffusers' ``QwenImageEditPipeline`` /
``QwenImageEditPlusPipeline`` (the folder's ``model_index.json`` says which; arXiv 2508.02324).

What an edit is conditioned on, each prompt record encoded once (cached by its prompt and its sources' 8-bit pixels):

- the instruction: Qwen2.5-VL's last hidden states of the pipeline's edit template *with the source images as image
  tokens* (the pipeline's own ``encode_prompt`` through its processor), less the template's 64 system-prefix tokens,
  so rows differ in length and are padded and masked as Qwen-Image's. Edit reads its one source at the VAE size;
  Edit-Plus reads each source at ``condition_area`` pixels (384 x 384 in the pipeline), announced as "Picture i:".
  The negative prompt is encoded with the same images, as both pipelines do, so the unconditional side is per
  record too;
- the sources' latents: each source resized to ``source_area`` pixels (1024 x 1024 in the pipelines) at its aspect
  ratio, through the VAE encoder (the distribution's mode), normalised and 2x2-packed by the pipeline's own
  ``prepare_latents``, kept in ``Conditioning.shared`` (:mod:`flowrl.policies.source_latents`).

Every evaluation appends the source tokens to the noisy image's, gives the transformer both layouts (``img_shapes``;
Edit-2511's ``zero_cond_t`` then sets the source tokens' timestep to 0) and keeps the first ``h w / 4`` output
tokens, as the pipelines' loops. True CFG with its per-token norm rescale, the sigma grid (its shift reads the
output's token count alone, as the pipelines) and decoding are Qwen-Image's (:class:`QwenImagePolicy`).

Deviations: the output is ``resolution`` square (the pipelines default to the last source's aspect ratio at 1024 x
1024 px); prompts are not truncated (the edit pipelines do not truncate either), so there is no
``max_sequence_length``. The processor is loaded as ``model_index.json`` names it (transformers' ``Qwen2VLProcessor``
for the published models, which needs torchvision).
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import DiffusionPipeline, QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.padded_prompts import MASK, pad_rows, unpadded
from flowrl.policies.pipeline_policy import joined_problems
from flowrl.policies.qwen_image import MAX_SEQUENCE_LENGTH, QwenImagePolicy
from flowrl.policies.sharding import is_sharded
from flowrl.policies.source_latents import SOURCE, SOURCE_GRID, SourceCache, by_layout, count_problem, row_key
from flowrl.policies.vl_processor import load_processor, processor_problem
from flowrl.rewards.pil_images import to_pil

#: the pipelines a Qwen-Image-Edit folder names in ``model_index.json`` (``_class_name``)
PIPELINES = {"QwenImageEditPipeline": QwenImageEditPipeline, "QwenImageEditPlusPipeline": QwenImageEditPlusPipeline}


def qwen_image_edit_problems(index: dict, source_area: int, condition_area: int, image_cache_size: int) -> list[str]:
    """The problems of the editing options and folder, found from ``model_index.json`` before any weight loads.

    >>> qwen_image_edit_problems({"_class_name": "QwenImagePipeline"}, 100, 1024, -1)  # doctest: +NORMALIZE_WHITESPACE
    ['policy.model: its model_index.json names QwenImagePipeline, not an edit pipeline (QwenImageEditPipeline,
      QwenImageEditPlusPipeline); text-to-image folders load with flowrl.policies.QwenImagePolicy',
     'policy.source_area=100 must be >= 1024 (32 x 32 px: the VAE and the 2x2 packing need 32 px sides)',
     'policy.image_cache_size=-1 must be >= 0 (0 disables the cache)']
    """
    problems = []
    if (name := index.get("_class_name", "?")) not in PIPELINES:
        problems.append(f"policy.model: its model_index.json names {name}, not an edit pipeline "
                        f"({', '.join(PIPELINES)}); text-to-image folders load with flowrl.policies.QwenImagePolicy")
    problems += processor_problem(index, "Qwen-Image-Edit")
    if source_area < 32 * 32:
        problems.append(f"policy.source_area={source_area} must be >= 1024 (32 x 32 px: the VAE and the 2x2 packing "
                        "need 32 px sides)")
    if condition_area < 28 * 28:
        problems.append(f"policy.condition_area={condition_area} must be >= 784 (28 x 28 px: one merged patch of the "
                        "vision tower)")
    if image_cache_size < 0:
        problems.append(f"policy.image_cache_size={image_cache_size} must be >= 0 (0 disables the cache)")
    return problems


class QwenImageEditPolicy(QwenImagePolicy):
    """Qwen-Image-Edit adapter (``Qwen/Qwen-Image-Edit``: one source image per prompt; ``Qwen/Qwen-Image-Edit-2509``
    and ``-2511``, Edit-Plus: one or more).

    Args:
        model: hub id, local folder or embedded name of a ``QwenImageEditPipeline`` / ``QwenImageEditPlusPipeline``
            folder.
        lora: LoRA options (default targets: ``QWEN_IMAGE_LORA_TARGETS``, the default of diffusers'
            ``examples/dreambooth/train_dreambooth_lora_qwen_image.py``: the edit models share Qwen-Image's
            transformer class and diffusers ships no edit training script); None for full fine-tuning.
        resolution: the edited image's height and width in pixels (a multiple of 16).
        source_area: pixels each source image is resized to for the VAE, at its aspect ratio, sides rounded to
            multiples of 32 (the pipelines: 1024 x 1024; flow_grpo's edit recipes: 512 x 512).
        condition_area: Edit-Plus: pixels each source is resized to for the vision tower (the pipeline: 384 x 384).
        negative_prompt: the unconditional side of true CFG (the Qwen-Image-Edit model cards use ``" "``).
        image_cache_size: prompt records whose encoded sources are kept (LRU).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy` (prompt encodings are cached per record).
    """

    conditioning_images = -1  # Edit-Plus: one or more; a Qwen-Image-Edit folder sets 1 on the instance

    def __init__(self, model: str = "Qwen/Qwen-Image-Edit-2509",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 source_area: int = 1024 * 1024, condition_area: int = 384 * 384, negative_prompt: str = " ",
                 image_cache_size: int = 256, torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = None,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        path = resolve_model(model)
        index = DiffusionPipeline.load_config(path)  # the pipeline class and the processor's, before any weight
        with joined_problems(qwen_image_edit_problems(index, source_area, condition_area, image_cache_size)):
            super().__init__(model=path, lora=lora, resolution=resolution, max_sequence_length=MAX_SEQUENCE_LENGTH,
                             negative_prompt=negative_prompt, torch_dtype=torch_dtype, autocast=autocast,
                             gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                             prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.pipeline_class = PIPELINES[index["_class_name"]]
        self.plus = self.pipeline_class is QwenImageEditPlusPipeline
        self.conditioning_images = -1 if self.plus else 1
        self.source_area, self.condition_area = source_area, condition_area
        self.processor_class = index["processor"]  # loaded as diffusers loads a pipeline component
        self.sources = SourceCache(image_cache_size)

    def _load_weights(self) -> None:
        super()._load_weights()
        self.processor = load_processor(self.path, {"processor": self.processor_class})

    def components(self) -> dict:
        return {**super().components(), "processor": self.processor}

    # -- conditioning ------------------------------------------------------------------------------------------

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """Each row's instruction with its sources, the negative prompt with the same sources (padded to one
        length, masked), and the sources' packed latents in ``shared``."""
        self.check_images(images)
        if problem := count_problem(images, self.conditioning_images, f"{type(self).__name__} on "
                                    f"{self.pipeline_class.__name__}"):
            raise ValueError(f"{problem}: give each prompt record's \"images\" list the model's count")
        keys = [row_key(row) for row in images]
        rows = self._text_rows(list(prompts), images, keys)
        null = self._text_rows([self.negative_prompt] * len(prompts), images, keys)
        length = max(len(row) for row in rows + null)
        (embeds, mask), (null_embeds, null_mask) = pad_rows(rows, length), pad_rows(null, length)
        return Conditioning(embeds, None, null_embeds, None, extra={MASK: mask}, null_extra={MASK: null_mask},
                            shared=self.sources.rows(images, self._encode_sources, self.denoiser.device))

    @torch.no_grad()
    def _text_rows(self, prompts: list[str], images: list[list[Tensor]], keys: list[str]) -> list[Tensor]:
        """Each row's unpadded encoding ``[L_i, D]`` of its prompt with its sources, encoded once per record."""
        cache_keys = [f"{prompt}\x00{key}" for prompt, key in zip(prompts, keys)]
        records = dict([*zip(cache_keys, zip(prompts, images))][::-1])  # a key's first record

        def encode(missing: list[str]) -> list[tuple[Tensor]]:  # one record per call, as the pipelines encode
            return [(self._encode_record(*records[key]),) for key in missing]

        found = self.prompt_cache.lookup(cache_keys, encode)
        return [found[key][0].to(self.denoiser.device) for key in cache_keys]

    def _encode_record(self, prompt: str, images: list[Tensor]) -> Tensor:
        """One prompt's unpadded encoding ``[L, D]`` with its sources, from the pipeline's ``encode_prompt``."""
        embeds, mask = self.pipeline().encode_prompt(prompt=[prompt], image=self._vision_images(images),
                                                     device=self.text_encoder.device)
        return unpadded(embeds, mask)[0]

    def _vae_size(self, image: Tensor) -> tuple[int, int]:
        """``(width, height)`` of a source for the VAE: ``source_area`` at its aspect ratio, multiples of 32."""
        return calculate_dimensions(self.source_area, image.shape[-1] / image.shape[-2])[:2]

    def _vision_images(self, row: list[Tensor]) -> list:
        """The PIL images the vision tower reads, resized as each pipeline resizes them."""
        processor = self.pipeline().image_processor
        sized = []
        for image in row:
            width, height = (calculate_dimensions(self.condition_area, image.shape[-1] / image.shape[-2])[:2]
                             if self.plus else self._vae_size(image))
            sized.append(processor.resize(to_pil(image[None])[0], height, width))
        return sized

    @torch.no_grad()
    def _encode_sources(self, row: list[Tensor]) -> tuple[Tensor, Tensor]:
        """One record's packed source latents ``[N, 4C]`` and token grids ``[K, 2]``, through the pipeline's own
        preprocessing and ``prepare_latents``."""
        pipe, factor = self.pipeline(), self.vae_scale_factor
        pixels, grid = [], []
        for image in row:
            width, height = self._vae_size(image)
            pil = to_pil(image[None])[0]
            if not self.plus:  # Edit resizes first and preprocesses the resized image (Edit-Plus: the original)
                pil = pipe.image_processor.resize(pil, height, width)
            pixels.append(pipe.image_processor.preprocess(pil, height, width).unsqueeze(2))  # [1, 3, 1, H, W]
            grid.append((height // factor // 2, width // factor // 2))
        channels = self.denoiser.config.in_channels // 4
        _, source = pipe.prepare_latents(pixels if self.plus else pixels[0], 1, channels, self.resolution,
                                         self.resolution, self.vae.dtype, self.vae.device, None, torch.zeros(1))
        return source[0].float(), torch.tensor(grid)

    # -- the denoiser ------------------------------------------------------------------------------------------

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        return by_layout(len(latents), cond.shared[SOURCE_GRID],
                         lambda rows, layout: self._forward_rows(latents[rows], sigma[rows], cond.select(rows), layout),
                         is_sharded(self.denoiser))

    def _forward_rows(self, latents: Tensor, sigma: Tensor, cond: Conditioning, layout: list[tuple[int, int]]):
        """Rows that share one source layout: the noisy tokens, then the sources', in one transformer call."""
        h, w = latents.shape[-2:]
        dtype, mask = self.denoiser_dtype, cond.extra[MASK]
        sources = cond.shared[SOURCE][:, :sum(a * b for a, b in layout)].to(dtype)
        shapes = [[(1, h // 2, w // 2), *[(1, a, b) for a, b in layout]]] * len(latents)
        with self._autocast():
            out = self.denoiser(hidden_states=torch.cat([self._pack(latents.to(dtype)), sources], 1),
                                timestep=sigma.to(dtype), encoder_hidden_states=cond.embeds.to(dtype),
                                encoder_hidden_states_mask=None if bool(mask.all()) else mask,  # as the pipelines
                                img_shapes=shapes, return_dict=False)[0]
        return self._unpack(out[:, :(h // 2) * (w // 2)].float(), h, w)
