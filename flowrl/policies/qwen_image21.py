"""Qwen-Image 2.1 (``Qwen/Qwen-Image-2.1``) on the components of diffusers' ``QwenImage21Pipeline``, text to image.

What 2.1 shares with Qwen-Image (:class:`~flowrl.policies.QwenImagePolicy`, which this extends): a Qwen-VL prompt
encoder whose last hidden states, less the chat template's system prefix, are the prompt (rows of their own length,
padded and masked by ``PaddedPromptPolicy``), true CFG on a negative prompt, a causal 3D VAE decoded as one-frame
videos with per-channel ``latents_mean`` / ``latents_std``, and the ``linspace(1, 1/T, T)`` grid shifted by ``mu`` of
the image's token count through ``FlowMatchEulerDiscreteScheduler``.

What differs, each as ``QwenImage21Pipeline`` does it:

- the encoder is Qwen3-VL read through its processor (``Qwen3VLProcessor``; the pipeline's template and system
  prompt, the final RMSNorm bypassed), and prompts are not truncated: no ``max_sequence_length``;
- the VAE compresses 16x into 64 channels and the transformer reads latents unpatched, so a token is one latent pixel
  (``_pack_latents`` is a plain flatten) and ``mu`` reads ``h w`` tokens;
- ``QwenImage21Transformer2DModel`` is one single-stream, block-causal sequence: the text, then the image's ``h w``
  tokens (``img_mask`` marks one slot per 2 x 2 of them), text modulated from t = 0 (``causal_condition``); its
  output covers the whole sequence and the image's velocity is the last ``h w`` tokens;
- guidance is plain CFG, without Qwen-Image's norm rescale; the pipeline defaults to none (``true_cfg_scale`` 1);
- the VAE decodes RGBA: the images are its first three channels (what PIL's ``convert("RGB")`` keeps);
- a folder may fix its grid (``sample_sigmas`` in ``model_index.json``, e.g. a turbo model's): it is used as the
  pipeline uses it, and a step count other than its length is refused.

One deviation, for reinforcement learning: the image's RoPE frame position follows the text *including padding*, so
in the pipeline a prompt's image depends on the longest prompt of its batch. The policy runs each text length as its
own denoiser batch, without padding, so a row's velocity is the pipeline's for that prompt alone whatever batch it
is in (rollout and update batches differ); under FSDP2, whose every denoiser call is a collective, each row is a call
of its own (as many on every rank; Flow-Factory's 2.1 recipe runs one sample per device throughout). The pipeline's key/value cache of the text (a sampling speed-up) is not
used: training needs the gradient through every token.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import (AutoencoderKLQwenImage21, DiffusionPipeline, QwenImage21Pipeline,
                       QwenImage21Transformer2DModel)
from torch import Tensor
from transformers import Qwen3VLForConditionalGeneration

from flowrl.model_paths import resolve_model
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.flow_sigmas import linear_grid, pipeline_sigmas, token_mu
from flowrl.policies.padded_prompts import MASK, PaddedPromptPolicy, unpadded
from flowrl.policies.pipeline_policy import joined_problems
from flowrl.policies.qwen_image import MAX_SEQUENCE_LENGTH, QwenImagePolicy
from flowrl.policies.sharding import is_sharded
from flowrl.policies.vl_processor import load_processor, processor_problem

#: QwenImage21Pipeline.__init__ sets vae_scale_factor = 16 (pixels per latent token) whatever the VAE config says
VAE_SCALE_FACTOR = 16
#: every projection of each single-stream block: attention and SwiGLU (Flow-Factory's Qwen-Image 2.1 adapter,
#: X-GenGroup/Flow-Factory src/flow_factory/models/qwen_image_21/qwen_image_21.py, ``default_target_modules``; the
#: transformer's own tensor-parallel plan names the same seven)
QWEN_IMAGE21_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "img_mlp.proj", "img_mlp.gate_layer", "img_mlp.out")


def qwen_image21_problems(index: dict, transformer_config: dict) -> list[str]:
    """The problems of a Qwen-Image 2.1 folder, found from its configs before any weight loads.

    >>> qwen_image21_problems({"_class_name": "QwenImagePipeline"}, {"patch_size": 2})  # doctest: +NORMALIZE_WHITESPACE
    ['policy.model: its model_index.json names QwenImagePipeline, not QwenImage21Pipeline; Qwen-Image (2509, 2512)
      folders load with flowrl.policies.QwenImagePolicy',
     'policy.model: the transformer has patch_size=2; QwenImage21Pipeline reads latents unpatched (patch_size 1)']
    """
    problems = []
    if (name := index.get("_class_name", "?")) != QwenImage21Pipeline.__name__:
        problems.append(f"policy.model: its model_index.json names {name}, not QwenImage21Pipeline; Qwen-Image (2509, "
                        "2512) folders load with flowrl.policies.QwenImagePolicy")
    if transformer_config.get("patch_size", 1) != 1:
        problems.append(f"policy.model: the transformer has patch_size={transformer_config['patch_size']}; "
                        "QwenImage21Pipeline reads latents unpatched (patch_size 1)")
    return problems + processor_problem(index, "Qwen-Image 2.1")


class QwenImage21Policy(QwenImagePolicy):
    """Qwen-Image 2.1 adapter (``Qwen/Qwen-Image-2.1``), text to image.

    Args:
        model: hub id, local folder or embedded name of a ``QwenImage21Pipeline`` folder.
        lora: LoRA options (default targets: ``QWEN_IMAGE21_LORA_TARGETS``, Flow-Factory's seven block projections);
            None for full fine-tuning.
        resolution: image height and width in pixels (a multiple of 32: 16 px per token, 2 x 2 tokens per slot).
        negative_prompt: the unconditional side of CFG, where ``guidance_scale > 1`` (the pipeline samples without).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = QwenImage21Pipeline
    default_lora_targets = QWEN_IMAGE21_LORA_TARGETS
    denoiser_kind = "QwenImage21Transformer2DModel"
    vae_class, denoiser_class = AutoencoderKLQwenImage21, QwenImage21Transformer2DModel
    text_encoder_class = Qwen3VLForConditionalGeneration

    def __init__(self, model: str = "Qwen/Qwen-Image-2.1",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 negative_prompt: str = " ", torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = None,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        path = resolve_model(model)
        index = DiffusionPipeline.load_config(path)  # the pipeline class, processor and grid, no weights
        transformer = QwenImage21Transformer2DModel.load_config(path, subfolder="transformer")
        with joined_problems(qwen_image21_problems(index, transformer)):
            # max_sequence_length: Qwen-Image's option, unused (2.1 does not truncate prompts)
            super().__init__(model=path, lora=lora, resolution=resolution, max_sequence_length=MAX_SEQUENCE_LENGTH,
                             negative_prompt=negative_prompt, torch_dtype=torch_dtype, autocast=autocast,
                             gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                             prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.index, self.sample_sigmas = index, index.get("sample_sigmas")

    def _load_prompt_reader(self) -> None:
        """The processor (Qwen3-VL's: chat template and tokenizer), of the class ``model_index.json`` names."""
        self.processor = load_processor(self.path, self.index)

    def components(self) -> dict:
        return dict(transformer=self.denoiser, scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
                    processor=self.processor, sample_sigmas=self.sample_sigmas)

    @property
    def vae_scale_factor(self) -> int:
        return VAE_SCALE_FACTOR

    def _encode_rows(self, prompts: list[str]) -> list[Tensor]:
        # the third output marks image tokens, of which a text-only prompt has none
        embeds, mask, _ = self.pipeline().encode_prompt(prompt=prompts, device=self.text_encoder.device)
        return unpadded(embeds, mask)

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        """The rows grouped by their prompt's length, each group one unpadded denoiser batch (see the module doc).
        Under FSDP2 every denoiser call is a collective and the ranks' batches hold different lengths, so each row is
        its own call: as many calls as rows, the same on every rank (the ranks' batches are one size)."""
        lengths = cond.extra[MASK].sum(dim=1)
        if is_sharded(self.denoiser):
            groups = list(torch.arange(len(latents), device=lengths.device)[:, None])
        else:
            groups = [torch.nonzero(lengths == n).flatten() for n in lengths.unique().tolist()]
        packed = torch.cat([self._denoise(latents[rows], sigma[rows], cond.embeds[rows, :int(lengths[rows[0]])])
                            for rows in groups])
        return packed[torch.cat(groups).argsort()]

    def _denoise(self, latents: Tensor, sigma: Tensor, embeds: Tensor) -> Tensor:
        """The velocity of rows whose prompts all have ``embeds.shape[1]`` tokens, as ``QwenImage21Pipeline``'s loop:
        text slots, then one image slot per 2 x 2 latent tokens; the image's tokens are the output's last."""
        (b, _, h, w), dtype = latents.shape, self.denoiser_dtype
        img_mask = torch.cat([torch.zeros(b, embeds.shape[1], dtype=torch.bool),
                              torch.ones(b, h * w // 4, dtype=torch.bool)], dim=1).to(latents.device)
        with self._autocast():
            out = self.denoiser(hidden_states=self._pack(latents.to(dtype)), timestep=sigma.to(dtype),
                                encoder_hidden_states=embeds.to(dtype), img_shapes=[[(1, h, w)]] * b,
                                img_mask=img_mask, return_dict=False)[0]
        return self._unpack(out[:, -h * w:].float(), h, w)

    def guide(self, v_uncond: Tensor, v_cond: Tensor, guidance_scale: float) -> Tensor:
        """Plain CFG ``v_u + g (v_c - v_u)``, as ``QwenImage21Pipeline`` (no per-token norm rescale)."""
        return PaddedPromptPolicy.guide(self, v_uncond, v_cond, guidance_scale)

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[0, 1]``: Qwen-Image's decode of the RGBA VAE, its RGB channels."""
        return super().decode(latents, cond)[:, :3]

    def latent_shape(self) -> tuple[int, ...]:
        size = 2 * (self.resolution // (self.vae_scale_factor * 2))  # QwenImage21Pipeline.prepare_latents
        return (self.denoiser_config["in_channels"], size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as ``QwenImage21Pipeline``: the folder's ``sample_sigmas`` (else ``linspace(1, 1/T,
        T)``) through the scheduler with ``mu`` of the ``h w`` latent tokens, ending at 0.

        Raises:
            ValueError: the folder fixes a grid of another length than ``num_steps``.
        """
        if self.sample_sigmas is not None and len(self.sample_sigmas) != num_steps:
            raise ValueError(f"this Qwen-Image 2.1 folder samples on its {len(self.sample_sigmas)} sample_sigmas "
                             f"(model_index.json), not {num_steps} steps: set the method's num_steps to "
                             f"{len(self.sample_sigmas)}")
        _, h, w = self.latent_shape()
        grid = self.sample_sigmas if self.sample_sigmas is not None else linear_grid(num_steps)
        return pipeline_sigmas(self.scheduler, num_steps, grid, token_mu(self.scheduler.config, h * w))
