"""FLUX.2 on the components of diffusers' ``Flux2KleinPipeline`` ([klein] 4B / 9B, base and step-distilled) and
``Flux2Pipeline`` ([dev]); the folder's ``model_index.json`` says which.

FLUX.2's noise lives in the space of *patchified, batch-normalised* latents: the VAE's ``C`` channels in 2x2
patches (``4C = 128`` channels at ``H/16 x W/16``), normalised by the VAE's batch-norm running statistics. These
``[4C, h, w]`` tensors are what the sampler sees (``latent_shape``); ``_forward`` only flattens them into
``h * w`` tokens with 4-D position ids (the pipeline's ``_pack_latents`` / ``_prepare_latent_ids``), and
``decode`` undoes the normalisation and the patchification before the VAE, as the pipeline's decode path does.

Prompts: [klein] stacks Qwen3's hidden states 9, 18 and 27 under its chat template (thinking off), [dev]
Mistral-Small-3.1's 10, 20 and 30 under a system message; both pad to ``max_sequence_length`` and feed every
token to the transformer (no attention mask), so all encodings have one length. Guidance by variant: [klein] base
models use true CFG on the empty prompt; step-distilled [klein] (``is_distilled``) samples without CFG (no
unconditional side, ``guidance_scale`` unused); [dev] is guidance-distilled: ``guidance_scale`` is the transformer's
``guidance`` input, one evaluation. The sigma grid is ``linspace(1, 1/T, T)`` shifted by the pipeline's empirical
``mu``, a function of the image's token count *and* of ``T``.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import (AutoencoderKLFlux2, DiffusionPipeline, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                       Flux2Pipeline, Flux2Transformer2DModel)
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import linear_grid, pipeline_sigmas
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.padded_prompts import PaddedPromptPolicy
from flowrl.policies.sd3 import resolution_problem

#: the pipelines a FLUX.2 folder names in ``model_index.json`` (``_class_name``)
PIPELINES = {"Flux2KleinPipeline": Flux2KleinPipeline, "Flux2Pipeline": Flux2Pipeline}


def flux2_lora_targets(num_single_blocks: int) -> tuple[str, ...]:
    """The default of diffusers' examples/dreambooth/train_dreambooth_lora_flux2_klein.py (and ``_flux2.py``): the
    double blocks' attention projections, the single blocks' fused QKV-MLP input and their attention output, named
    per block because a double block's ``attn.to_out`` is a ModuleList that LoRA cannot wrap.

    >>> flux2_lora_targets(2)[-3:]
    ('to_qkv_mlp_proj', 'single_transformer_blocks.0.attn.to_out', 'single_transformer_blocks.1.attn.to_out')
    """
    return ("to_k", "to_q", "to_v", "to_out.0", "to_qkv_mlp_proj",
            *(f"single_transformer_blocks.{i}.attn.to_out" for i in range(num_single_blocks)))


def flux2_problems(pipeline: str, resolution: int, vae_factor: int, max_sequence_length: int) -> list[str]:
    """The problems of FLUX.2 options, found from the configs before any weight loads.

    >>> flux2_problems("FluxPipeline", 500, 8, 0)  # doctest: +NORMALIZE_WHITESPACE
    ['policy.model: its model_index.json names FluxPipeline, not a FLUX.2 pipeline (Flux2KleinPipeline,
      Flux2Pipeline); FLUX.1 folders load with flowrl.policies.FluxPolicy',
     'policy.resolution=500 must be a positive multiple of 16 (VAE downsampling x transformer patch size), e.g. 496',
     'policy.max_sequence_length=0 must be >= 1 (text tokens per prompt; the pipelines use 512)']
    """
    problems = []
    if pipeline not in PIPELINES:
        problems.append(f"policy.model: its model_index.json names {pipeline}, not a FLUX.2 pipeline "
                        f"({', '.join(PIPELINES)}); FLUX.1 folders load with flowrl.policies.FluxPolicy")
    if problem := resolution_problem(resolution, vae_factor * 2):  # latents are patchified in 2x2
        problems.append(problem)
    if max_sequence_length < 1:
        problems.append(f"policy.max_sequence_length={max_sequence_length} must be >= 1 (text tokens per prompt; the "
                        "pipelines use 512)")
    return problems


def flux2_guidance(index: dict, transformer_config: dict) -> str:
    """``embedded`` ([dev]: the guidance input), ``none`` (step-distilled [klein]) or ``cfg`` ([klein] base).

    >>> flux2_guidance({"is_distilled": True}, {"guidance_embeds": False}), flux2_guidance({}, {})
    ('none', 'cfg')
    """
    if transformer_config.get("guidance_embeds"):
        return "embedded"
    return "none" if index.get("is_distilled") else "cfg"


def _text_encoder(pipeline: str, path: str, dtype: torch.dtype):
    """[klein]: Qwen3 and its tokenizer; [dev]: Mistral-Small-3.1 and its processor (chat template with images)."""
    if pipeline == "Flux2Pipeline":
        from transformers import AutoProcessor, Mistral3ForConditionalGeneration

        return (AutoProcessor.from_pretrained(path, subfolder="tokenizer"),
                Mistral3ForConditionalGeneration.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval())
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    return (AutoTokenizer.from_pretrained(path, subfolder="tokenizer"),
            Qwen3ForCausalLM.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval())


class Flux2Policy(PaddedPromptPolicy):
    """FLUX.2 adapter.

    Args:
        model: hub id (``black-forest-labs/FLUX.2-klein-base-4B``, ``...-klein-4B``, ``...-klein-9B``,
            ``black-forest-labs/FLUX.2-dev``), local folder or embedded name of a ``Flux2KleinPipeline`` /
            ``Flux2Pipeline`` folder.
        lora: LoRA options (default targets: :func:`flux2_lora_targets` of the model's single blocks, the default of
            diffusers' ``examples/dreambooth/train_dreambooth_lora_flux2_klein.py``); None for full fine-tuning.
        resolution: image height and width in pixels (a multiple of 16).
        max_sequence_length: text tokens per prompt (padded to this length, as the pipelines do).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = Flux2KleinPipeline  # per instance: the pipeline its model_index.json names
    denoiser_kind = "Flux2Transformer2DModel"

    def __init__(self, model: str = "black-forest-labs/FLUX.2-klein-base-4B",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), resolution: int = 512,
                 max_sequence_length: int = 512, torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = None,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        index = DiffusionPipeline.load_config(self.path)  # model_index.json: the pipeline class and its config
        self.pipeline_name = index.get("_class_name", "?")
        self.vae_config = component_config(AutoencoderKLFlux2, self.path, "vae")
        self.denoiser_config = component_config(Flux2Transformer2DModel, self.path, "transformer")
        self.resolution, self.max_sequence_length = resolution, max_sequence_length
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")
        self.check_problems(flux2_problems(self.pipeline_name, resolution, self.vae_scale_factor,
                                           max_sequence_length))
        self.pipeline_class = PIPELINES[self.pipeline_name]
        self.is_distilled = bool(index.get("is_distilled", False))  # step-distilled [klein]
        # true CFG only for the [klein] base models: step-distilled [klein] and guidance-distilled [dev] have none
        self.classifier_free = not (self.is_distilled or self.denoiser_config.guidance_embeds)
        self.guidance_kind = flux2_guidance(index, self.denoiser_config)
        self.default_lora_targets = flux2_lora_targets(self.denoiser_config.num_single_layers)

    def _load_weights(self) -> None:
        self.vae = AutoencoderKLFlux2.from_pretrained(self.path, subfolder="vae", torch_dtype=self.torch_dtype).eval()
        self.tokenizer, self.text_encoder = _text_encoder(self.pipeline_name, self.path, self.torch_dtype)
        self.denoiser = Flux2Transformer2DModel.from_pretrained(self.path, subfolder="transformer",
                                                                torch_dtype=self.denoiser_dtype)

    def components(self) -> dict:
        parts = dict(transformer=self.denoiser, scheduler=self.scheduler, vae=self.vae, text_encoder=self.text_encoder,
                     tokenizer=self.tokenizer)
        return {**parts, "is_distilled": self.is_distilled} if self.pipeline_class is Flux2KleinPipeline else parts

    def _encode_rows(self, prompts: list[str]) -> list[Tensor]:
        embeds, _ = self.pipeline().encode_prompt(prompt=prompts, device=self.text_encoder.device,
                                                  max_sequence_length=self.max_sequence_length)
        return list(embeds)  # every prompt padded to max_sequence_length by the pipeline: no mask needed

    def velocity(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 cfg_gradient: str = "both") -> Tensor:
        """[dev]: ``guidance_scale`` is the transformer's guidance input (one evaluation); [klein]: CFG (base) or
        the conditional evaluation alone (step-distilled: its encoding has no unconditional side)."""
        if self.denoiser.config.guidance_embeds:
            return self._forward(latents, sigma, cond, guidance_scale)
        return super().velocity(latents, sigma, cond, guidance_scale, cfg_gradient)

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0) -> Tensor:
        b, c, h, w = latents.shape
        dtype, device = self.denoiser_dtype, latents.device
        guidance = None
        if self.denoiser.config.guidance_embeds:
            guidance = torch.full((b,), float(guidance_scale), device=device, dtype=torch.float32)
        with self._autocast():
            out = self.denoiser(hidden_states=self.pipeline_class._pack_latents(latents.to(dtype)),  # [B, h * w, C]
                                encoder_hidden_states=cond.embeds.to(dtype), timestep=sigma.to(dtype),
                                # every row has the same ids and the transformer reads row 0: build one row
                                img_ids=self.pipeline_class._prepare_latent_ids(latents[:1]).to(device),
                                txt_ids=self.pipeline_class._prepare_text_ids(cond.embeds[:1]).to(device),
                                guidance=guidance, return_dict=False)[0]
        # the position ids enumerate the tokens row-major, so the pipeline's scatter by ids is this reshape
        return out.float().transpose(1, 2).reshape(b, c, h, w)

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[0, 1]``: the batch-norm statistics undone, the 2x2 patches unfolded
        (``[4C, h, w] -> [C, 2h, 2w]``), then the VAE, ``vae_chunk_size`` latents at a time."""
        bn, eps = self.vae.bn, self.vae.config.batch_norm_eps
        mean = bn.running_mean.view(1, -1, 1, 1).float()
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1).float() + eps)
        return self.decode_chunks(
            latents, lambda z: self.pipeline_class._unpatchify_latents(z.float() * std + mean).to(self.vae.dtype))

    def latent_shape(self) -> tuple[int, ...]:
        size = self.resolution // (self.vae_scale_factor * 2)
        return (self.denoiser_config.in_channels, size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as the FLUX.2 pipelines: ``linspace(1, 1/T, T)`` (or the scheduler's own grid with
        ``use_flow_sigmas``) shifted by ``compute_empirical_mu(h * w, T)``, ending at 0."""
        _, h, w = self.latent_shape()
        return pipeline_sigmas(self.scheduler, num_steps, linear_grid(num_steps, self.scheduler.config),
                               compute_empirical_mu(h * w, num_steps))
