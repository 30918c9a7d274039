"""HunyuanVideo 1.5 text-to-video (arXiv 2511.18870; the 480p / 720p T2V checkpoints and their CFG-distilled
variants) on the components of diffusers' ``HunyuanVideo15Pipeline``.

Latents are ``[C, F, h, w]`` (32 channels; ``F = (num_frames - 1) / 4 + 1``, 16x spatial compression, patch size 1).
Every evaluation reads ``[latents, condition latents, mask]`` (``2C + 1`` channels), all-zero condition channels in
text-to-video, and the vision tokens as zeros (729 x 1152, which the transformer then masks), as the pipeline's
``prepare_cond_latents_and_mask``. A prompt is two encodings, both from the pipeline's ``encode_prompt``: Qwen2.5-VL's
third-last hidden states under the pipeline's system template (1000 tokens after the template's 108, padded, with a
mask) and ByT5's encoding of the prompt's quoted text (the glyph encoder: 256 tokens; zeros and an empty mask for a
prompt without quotes); ``max_sequence_length`` and ``glyph_max_sequence_length`` set the two lengths (the
pipeline's ``tokenizer_max_length`` and ``tokenizer_2_max_length`` attributes). Both are fixed-length, so rows of a batch stack without padding; the masks travel in
``Conditioning.extra``.

Guidance is the folder's ``guider`` (``ClassifierFreeGuidance``: ``v_u + g (v_c - v_u)`` on the negative prompt):
the base checkpoints publish 6.0, the ``*_distilled`` ones 1.0 (CFG-distilled: sampled with one evaluation, no
guidance input), for which the policy's ``guidance_kind`` is ``none``. The sigma grid is the pipeline's:
``linspace(1, 0, T + 1)[:-1]`` through the scheduler's static ``shift`` (5 at 480p, 7 or 9 at 720p), the transformer
reading ``1000 sigma``. Decoding divides by the VAE's ``scaling_factor``, one video at a time by default (diffusers
0.42.1's VAE mid-block attention fails on a batch of more than one video on the math backend).

Not covered: the step-distilled image-to-video checkpoint (``use_meanflow``: its velocity reads the next step's
timestep), refused before loading; sparse attention (SSTA) and the super-resolution stage, which diffusers does not run.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from diffusers import (AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline,
                       HunyuanVideo15Transformer3DModel)
from diffusers.guiders import ClassifierFreeGuidance
from diffusers.loaders.lora_pipeline import HunyuanVideoLoraLoaderMixin
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import pipeline_sigmas
from flowrl.policies.pipeline_policy import PipelinePolicy
from flowrl.policies.wan import video_size_problems
from flowrl.policies.wan_schedule import TimestepTable

#: the attention projections of both streams (the video tokens' to_*, the text tokens' add_*_proj): the dense layers
#: of HunyuanVideo 1.5's double-stream blocks that diffusers' HunyuanVideo LoRA scripts adapt
HUNYUAN15_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
#: the extra fields of a prompt's encoding, in ``_encode_batch``'s order after the Qwen embeddings
TEXT_FIELDS = ("mask", "glyph_embeds", "glyph_mask")
#: the vision tokens text-to-video passes as zeros (``HunyuanVideo15Pipeline.vision_num_semantic_tokens``, set in its
#: ``__init__``; SigLIP's 27 x 27 patches)
VISION_TOKENS = 729


def guider_problems(guider: dict) -> list[str]:
    """What of the folder's guider config flowrl's classifier-free guidance would not reproduce.

    >>> [p.split(",")[0] for p in guider_problems({"guidance_scale": 6.0, "guidance_rescale": 0.7, "stop": 1.0})]
    ['policy.model: its guider sets guidance_rescale=0.7']
    """
    problems = []
    for key, expected in (("guidance_rescale", 0.0), ("use_original_formulation", False), ("start", 0.0),
                          ("stop", 1.0)):
        if key in guider and guider[key] != expected:
            problems.append(f"policy.model: its guider sets {key}={guider[key]}, which flowrl's CFG (v_u + g (v_c - "
                            f"v_u)) does not apply; use a folder whose guider/guider_config.json has {key} "
                            f"{expected}")
    return problems


class HunyuanVideo15Policy(PipelinePolicy):
    """HunyuanVideo 1.5 text-to-video adapter.

    Args:
        model: hub id (``hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v``, ``..._720p_t2v``,
            ``..._480p_t2v_distilled``), local folder or embedded name of a ``HunyuanVideo15Pipeline`` folder.
        lora: LoRA options (default targets: both streams' attention projections); None for full fine-tuning.
        height, width, num_frames: the video's size in pixels and frames (``num_frames = 1 + 4k``; the pipeline's
            default is 121 frames at the target size's 16:9 bucket, 848 x 480 at 480p).
        negative_prompt: the unconditional side of classifier-free guidance (the pipeline's default: ``""``).
        max_sequence_length: Qwen2.5-VL tokens per prompt after the template (the pipeline's
            ``tokenizer_max_length``, 1000); glyph_max_sequence_length: ByT5 tokens of the quoted text (its
            ``tokenizer_2_max_length``, 256). Every prompt is padded to them, so every evaluation carries them.
        flow_shift: override the scheduler's shift; None: the checkpoint's.
        vae_tiling: decode in spatial tiles (large videos).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = HunyuanVideo15Pipeline
    #: the pipeline has no LoRA loader of its own: exports are written in the HunyuanVideo layout (``transformer.``
    #: keys), which ``pipe.transformer.load_lora_adapter(folder, prefix="transformer")`` loads
    lora_writer = HunyuanVideoLoraLoaderMixin
    default_lora_targets = HUNYUAN15_LORA_TARGETS
    denoiser_kind = "HunyuanVideo15Transformer3DModel"

    def __init__(self, model: str = "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=32.0), height: int = 480, width: int = 848,
                 num_frames: int = 33, negative_prompt: str = "", max_sequence_length: int = 1000,
                 glyph_max_sequence_length: int = 256, flow_shift: Optional[float] = None,
                 vae_tiling: bool = False, torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = 1,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.height, self.width, self.num_frames = height, width, num_frames
        self.negative_prompt, self.vae_tiling = negative_prompt, vae_tiling
        self.max_sequence_length, self.glyph_max_sequence_length = max_sequence_length, glyph_max_sequence_length
        self.denoiser_config = component_config(HunyuanVideo15Transformer3DModel, self.path, "transformer")
        self.vae_config = component_config(AutoencoderKLHunyuanVideo15, self.path, "vae")
        guider = ClassifierFreeGuidance.load_config(self.path, subfolder="guider")
        spatial = self.vae_config.spatial_compression_ratio * self.denoiser_config.patch_size
        problems = video_size_problems(height, width, num_frames, spatial, self.vae_config.temporal_compression_ratio)
        problems += guider_problems(guider)
        if self.denoiser_config.use_meanflow:
            problems.append(f"policy.model={model} is a step-distilled (MeanFlow) checkpoint: its velocity reads the "
                            "next step's timestep (timestep_r), which flowrl's sampler and log-probs do not model; use "
                            "a base or CFG-distilled HunyuanVideo 1.5 folder")
        for key, value, published in (("max_sequence_length", max_sequence_length, 1000),
                                      ("glyph_max_sequence_length", glyph_max_sequence_length, 256)):
            if value < 1:
                problems.append(f"policy.{key}={value} must be >= 1 (the pipeline's {published})")
        if flow_shift is not None and flow_shift <= 0:
            problems.append(f"policy.flow_shift={flow_shift} must be > 0 (or null: the checkpoint's)")
        self.check_problems(problems + self._conditioning_problems())
        # the CFG-distilled folders' guider runs one evaluation (guidance_scale 1 or disabled), as their pipeline does
        guided = guider.get("enabled", True) and guider.get("guidance_scale", 7.5) > 1.0
        self.guidance_kind = "cfg" if guided else "none"
        shift = {} if flow_shift is None else {"shift": flow_shift}
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler", **shift)
        self.timestep_table = TimestepTable(self.scheduler.config.num_train_timesteps)

    def _conditioning_problems(self) -> list[str]:
        """Image-to-video checks its size against the pipeline's buckets here; text-to-video has nothing more."""
        return []

    def _load_weights(self) -> None:
        from transformers import AutoTokenizer, ByT5Tokenizer, Qwen2_5_VLTextModel, T5EncoderModel

        path, dtype = self.path, self.torch_dtype
        self.vae = AutoencoderKLHunyuanVideo15.from_pretrained(path, subfolder="vae", torch_dtype=dtype).eval()
        if self.vae_tiling:
            self.vae.enable_tiling()
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.text_encoder = Qwen2_5_VLTextModel.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval()
        self.tokenizer_2 = ByT5Tokenizer.from_pretrained(path, subfolder="tokenizer_2")
        self.text_encoder_2 = T5EncoderModel.from_pretrained(path, subfolder="text_encoder_2", dtype=dtype).eval()
        self.guider = ClassifierFreeGuidance.from_pretrained(path, subfolder="guider")
        self._load_conditioning(path)
        self.denoiser = HunyuanVideo15Transformer3DModel.from_pretrained(path, subfolder="transformer",
                                                                         torch_dtype=self.denoiser_dtype)

    def _load_conditioning(self, path: str) -> None:
        """Image-to-video loads its vision tower here; text-to-video has nothing more."""

    def components(self) -> dict:
        return dict(text_encoder=self.text_encoder, tokenizer=self.tokenizer, transformer=self.denoiser, vae=self.vae,
                    scheduler=self.scheduler, text_encoder_2=self.text_encoder_2, tokenizer_2=self.tokenizer_2,
                    guider=self.guider)

    # -- prompts -----------------------------------------------------------------------------------------------

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor, ...]:
        """``(embeds [n, L, D], mask [n, L], glyph_embeds [n, L2, D2], glyph_mask [n, L2])`` from the pipeline's
        ``encode_prompt`` (both masks float, as the pipeline hands them to the transformer), ``L`` and ``L2`` the
        policy's lengths (the pipeline reads them from its attributes, not from arguments)."""
        pipe = self.pipeline()
        pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = self.max_sequence_length, \
            self.glyph_max_sequence_length
        return pipe.encode_prompt(prompt=prompts, device=self.text_encoder.device, dtype=self.denoiser_dtype,
                                  batch_size=len(prompts))

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts and, when the model is guided, ``negative_prompt``; the masks and the glyph encoding in
        ``extra`` (no pooled embedding)."""
        self.check_images(images)
        embeds, *rest = self._encoded(list(prompts))
        shared = self._image_conditioning(images)
        if self.guidance_kind == "none":
            return Conditioning(embeds, extra=dict(zip(TEXT_FIELDS, rest)), shared=shared)
        null, *null_rest = self._encoded([self.negative_prompt] * len(prompts))
        return Conditioning(embeds, None, null, None, extra=dict(zip(TEXT_FIELDS, rest)),
                            null_extra=dict(zip(TEXT_FIELDS, null_rest)), shared=shared)

    def _image_conditioning(self, images: Optional[list[list[Tensor]]]) -> dict[str, Tensor]:
        return {}

    # -- the denoiser ------------------------------------------------------------------------------------------

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as the pipeline: ``linspace(1, 0, T + 1)[:-1]`` shifted by the scheduler, then 0."""
        sigmas = pipeline_sigmas(self.scheduler, num_steps, np.linspace(1.0, 0.0, num_steps + 1)[:-1])
        self.timestep_table.remember(sigmas[:-1], self.scheduler.timesteps)
        return sigmas

    def _condition(self, latents: Tensor, cond: Conditioning) -> tuple[Tensor, Tensor]:
        """``(condition channels [B, C + 1, f, h, w], vision tokens [B, 729, D])``: zeros in text-to-video."""
        b, c, f, h, w = latents.shape
        return (latents.new_zeros(b, c + 1, f, h, w),
                latents.new_zeros(b, VISION_TOKENS, self.denoiser_config.image_embed_dim))

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        dtype = self.denoiser_dtype
        condition, image_embeds = self._condition(latents, cond)
        model_input = torch.cat([latents, condition.to(latents.dtype)], dim=1).to(dtype)
        extra = cond.extra
        with self._autocast():
            out = self.denoiser(hidden_states=model_input, image_embeds=image_embeds.to(dtype),
                                timestep=self.timestep_table(sigma).to(dtype),
                                encoder_hidden_states=cond.embeds.to(dtype),
                                encoder_attention_mask=extra["mask"].to(dtype),
                                encoder_hidden_states_2=extra["glyph_embeds"].to(dtype),
                                encoder_attention_mask_2=extra["glyph_mask"].to(dtype), return_dict=False)[0]
        return out.float()

    # -- videos ------------------------------------------------------------------------------------------------

    def latent_shape(self) -> tuple[int, ...]:
        cfg = self.vae_config
        return (cfg.latent_channels, (self.num_frames - 1) // cfg.temporal_compression_ratio + 1,
                self.height // cfg.spatial_compression_ratio, self.width // cfg.spatial_compression_ratio)

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Videos ``[B, F, 3, H, W]`` in ``[0, 1]`` from latents ``[B, C, f, h, w]``, ``vae_chunk_size`` at a time,
        as the pipeline (divided by ``scaling_factor``, decoded, ``postprocess_video``'s ``[-1, 1] -> [0, 1]``)."""
        scale = self.vae.config.scaling_factor
        videos = self.decode_chunks(latents, lambda z: z.to(self.vae.dtype) / scale, autocast=False)
        return videos.permute(0, 2, 1, 3, 4)
