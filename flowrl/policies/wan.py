"""Wan text-to-video (Wan 2.1 T2V 1.3B / 14B, Wan 2.2 T2V A14B, Wan 2.2 TI2V-5B) on the components of diffusers'
``WanPipeline`` (arXiv 2503.20314).

Latents are ``[C, F, h, w]`` (``F = (num_frames - 1) / 4 + 1`` latent frames): the sampler, its steps and the
log-probs run on them unchanged (a log-prob averages over every latent dimension, frames included). Prompts go
through the pipeline's ``encode_prompt`` (UMT5, zero-padded to ``max_sequence_length``); classifier-free guidance
pairs them with ``negative_prompt`` as the pipeline does. The sigma grid is the checkpoint's scheduler's (UniPC with
``flow_shift`` for the published checkpoints, FlowMatchEuler with ``shift`` elsewhere), and the denoiser sees the
scheduler's own timesteps for it (UniPC's are integers), so that Wan 2.2's expert choice, ``t >= boundary_ratio *
num_train_timesteps``, falls on the pipeline's step. One deviation: UniPC moves a first sigma of 1 to ``1 - 1e-6``
(a guard of its own multistep solver); flowrl's grid keeps 1, where the Flow-GRPO SDE step is defined (at
``1 - 1e-6`` its noise scale ``sqrt(sigma / (1 - sigma))`` would be 1000x), with the pipeline's timestep for it.

Decoding: ``vae_chunk_size`` videos at a time through ``AutoencoderKLWan`` (kept in float32, as diffusers' Wan
examples), which decodes one latent frame at a time through its causal cache; ``vae_tiling`` also splits frames
spatially. Videos come back ``[B, F, 3, H, W]`` in ``[0, 1]``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
from torch import Tensor
from transformers import AutoTokenizer, UMT5EncoderModel

from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.pipeline_policy import PipelinePolicy
from flowrl.policies.wan_experts import EXPERTS, WanExperts
from flowrl.policies.wan_schedule import TimestepTable, load_scheduler, own_solver, scheduler_sigmas

# flow_grpo scripts/train_wan2_1.py: the attention projections (add_* exist in the image-to-video models only;
# peft skips a name no module has as long as another name matches)
WAN_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj")


def video_size_problems(height: int, width: int, num_frames: int, spatial: int, temporal: int,
                        key: str = "policy.") -> list[str]:
    """Sizes the latent grid cannot hold, each naming the key and a fix.

    >>> video_size_problems(480, 830, 80, 16, 4)  # doctest: +NORMALIZE_WHITESPACE
    ['policy.width=830 must be a positive multiple of 16 (VAE downsampling x transformer patch size), e.g. 816',
     'policy.num_frames=80 must be 1 + a multiple of 4 (the VAE compresses 4 frames into one latent frame), e.g. 77
      or 81']
    """
    problems = []
    for name, value in (("height", height), ("width", width)):
        if value <= 0 or value % spatial:
            problems.append(f"{key}{name}={value} must be a positive multiple of {spatial} (VAE downsampling x "
                            f"transformer patch size), e.g. {max(spatial, value // spatial * spatial)}")
    if num_frames < 1 or (num_frames - 1) % temporal:
        lower = max(1, (num_frames - 1) // temporal * temporal + 1)
        problems.append(f"{key}num_frames={num_frames} must be 1 + a multiple of {temporal} (the VAE compresses "
                        f"{temporal} frames into one latent frame), e.g. {lower} or {lower + temporal}")
    return problems


class WanPolicy(PipelinePolicy):
    """Wan text-to-video adapter.

    Args:
        model: hub id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``, ``Wan-AI/Wan2.2-T2V-A14B-Diffusers``), local folder or
            embedded name of a ``WanPipeline`` folder.
        lora: LoRA options (default targets: the attention projections, as flow_grpo); None for full fine-tuning.
        height, width, num_frames: the video's size in pixels and frames (``num_frames = 1 + 4k``).
        max_sequence_length: UMT5 tokens per prompt (the pipeline's 512).
        negative_prompt: the unconditional side of classifier-free guidance ("" as flow_grpo and diffusers).
        flow_shift: override the scheduler's shift (Wan's docs: 3.0 for 480p, 5.0 for 720p); None: the
            checkpoint's.
        guidance_scale_2: Wan 2.2 A14B: the guidance of the low-noise expert's steps (None: the method's
            ``guidance_scale`` on every step, as the pipeline).
        trained_experts: Wan 2.2 A14B: the experts that train (LoRA or full), ``transformer`` (high noise) and/or
            ``transformer_2`` (low noise); the others stay frozen.
        vae_tiling: decode in spatial tiles (large videos).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy` (checkpointing recomputes each transformer block).
    """

    pipeline_class = WanPipeline
    default_lora_targets = WAN_LORA_TARGETS
    denoiser_kind = "WanExperts"

    def __init__(self, model: str = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                 lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=64.0), height: int = 240, width: int = 416,
                 num_frames: int = 33, max_sequence_length: int = 512, negative_prompt: str = "",
                 flow_shift: Optional[float] = None, guidance_scale_2: Optional[float] = None,
                 trained_experts: Sequence[str] = EXPERTS, torch_dtype: str = "float32",
                 autocast: Optional[str] = None, gradient_checkpointing: bool = False,
                 vae_chunk_size: Optional[int] = 1, vae_tiling: bool = False, prompt_cache_size: int = 1024,
                 activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        index = self.pipeline_class.load_config(self.path)
        self.height, self.width, self.num_frames = height, width, num_frames
        self.max_sequence_length, self.negative_prompt = max_sequence_length, negative_prompt
        self.expert_names = ["transformer", "transformer_2"] if (index.get("transformer_2") or [None])[0] else [
            "transformer"]
        self.trained_experts, self.vae_tiling = tuple(trained_experts), vae_tiling
        self.denoiser_config = component_config(WanTransformer3DModel, self.path, "transformer")
        self.vae_config = component_config(AutoencoderKLWan, self.path, "vae")
        spatial, temporal = self.vae_config.scale_factor_spatial, self.vae_config.scale_factor_temporal
        problems = video_size_problems(height, width, num_frames, spatial * self.denoiser_config.patch_size[1],
                                       temporal)
        if unknown := sorted(set(trained_experts) - set(EXPERTS)):
            problems.append(f"policy.trained_experts names {unknown}; choose among {list(EXPERTS)}")
        elif not set(trained_experts) & set(self.expert_names):
            problems.append(f"policy.trained_experts={list(trained_experts)} names none of this model's experts "
                            f"{self.expert_names}; choose among them")
        if guidance_scale_2 is not None and len(self.expert_names) < 2:
            problems.append(f"policy.guidance_scale_2={guidance_scale_2} needs Wan 2.2's second expert "
                            "(transformer_2), which this model has not; leave it null")
        if flow_shift is not None and flow_shift <= 0:
            problems.append(f"policy.flow_shift={flow_shift} must be > 0 (or null: the checkpoint's)")
        self.check_problems(problems + self._conditioning_problems(index))
        self.index = index
        self.guidance_scale_2, self.expand_timesteps = guidance_scale_2, bool(index.get("expand_timesteps"))
        self.boundary_ratio = index.get("boundary_ratio")
        self.scheduler = load_scheduler(self.path, flow_shift)
        self.timestep_table = TimestepTable(self.scheduler.config.num_train_timesteps,
                                            integer=bool(self.scheduler.config.get("use_flow_sigmas")))

    def _conditioning_problems(self, index: dict) -> list[str]:
        """Image-to-video checks its image encoder's options here; text-to-video has nothing more."""
        return []

    def _load_weights(self) -> None:
        path = self.path
        self.vae = AutoencoderKLWan.from_pretrained(path, subfolder="vae", torch_dtype=torch.float32).eval()
        if self.vae_tiling:
            self.vae.enable_tiling()
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.text_encoder = UMT5EncoderModel.from_pretrained(path, subfolder="text_encoder",
                                                             dtype=self.torch_dtype).eval()
        self._load_conditioning(path, self.index)
        experts = {name: WanTransformer3DModel.from_pretrained(
            path, subfolder=name,
            torch_dtype=self.denoiser_dtype if name in self.trained_experts else self.torch_dtype)
            for name in self.expert_names}
        two = len(self.expert_names) > 1
        boundary = self.boundary_ratio * self.scheduler.config.num_train_timesteps if two else None
        self.denoiser = WanExperts(experts["transformer"], experts.get("transformer_2"), boundary,
                                   self.trained_experts)

    def _load_conditioning(self, path: str, index: dict) -> None:
        """Image-to-video loads its image encoder here; text-to-video has nothing more."""

    def _setup_trainable(self, denoiser: WanExperts) -> None:
        super()._setup_trainable(denoiser)
        if self.lora is None:  # full fine-tuning of the trained experts only
            for name in set(denoiser.names) - set(denoiser.trained):
                getattr(denoiser, name).requires_grad_(False)

    def setup_reference(self) -> None:
        """LoRA: nothing (adapters off); full fine-tuning: frozen copies of the trained experts only."""
        if self.lora is None:
            self.denoiser.setup_reference()

    @contextmanager
    def reference(self) -> Iterator[None]:
        if self.lora is not None:
            with super().reference():
                yield
            return
        with self.denoiser.as_reference():
            yield

    def components(self) -> dict:
        return dict(tokenizer=self.tokenizer, text_encoder=self.text_encoder, vae=self.vae, scheduler=self.scheduler,
                    transformer=self.denoiser.transformer, transformer_2=self.denoiser.transformer_2,
                    boundary_ratio=self.boundary_ratio, expand_timesteps=self.expand_timesteps)

    def lora_modules(self) -> dict[str, torch.nn.Module]:
        """The file of each trained expert's LoRA weights in an export (``transformer_2``'s loads into the pipeline
        with ``load_lora_weights(folder, weight_name=..., load_into_transformer_2=True)``)."""
        files = {"transformer": "pytorch_lora_weights.safetensors",
                 "transformer_2": "pytorch_lora_weights_transformer_2.safetensors"}
        return {files[name]: getattr(self.denoiser, name) for name in self.denoiser.trained}

    # -- prompts -----------------------------------------------------------------------------------------------

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor]:
        # WanPipeline's encode_prompt for every Wan family: WanImageToVideoPipeline's is the same code, except that
        # diffusers 0.42 calls ftfy there without checking it is installed (a NameError without it)
        text = WanPipeline(tokenizer=self.tokenizer, text_encoder=self.text_encoder, vae=self.vae,
                           scheduler=self.scheduler)
        embeds, _ = text.encode_prompt(prompt=prompts, do_classifier_free_guidance=False,
                                       max_sequence_length=self.max_sequence_length, device=self.text_encoder.device)
        return (embeds,)

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts and, for classifier-free guidance, ``negative_prompt`` (no pooled embedding)."""
        self.check_images(images)
        (embeds,) = self._encoded(list(prompts))
        (null_embeds,) = self._encoded([self.negative_prompt] * len(prompts))
        return Conditioning(embeds, None, null_embeds, None, shared=self._image_conditioning(images))

    def _image_conditioning(self, images: Optional[list[list[Tensor]]]) -> dict[str, Tensor]:
        return {}

    # -- the denoiser ------------------------------------------------------------------------------------------

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32: the scheduler's grid (its shift), ending at 0, first sigma 1 (see the module doc)."""
        sigmas, timesteps = scheduler_sigmas(self.scheduler, num_steps)
        self.timestep_table.remember(sigmas[:-1], timesteps)
        return sigmas

    def solver(self):
        """A fresh copy of the folder's UniPC (or other non-Euler) scheduler: ``generate`` steps with it as
        ``WanPipeline`` does; None for a FlowMatchEuler folder (flowrl's Euler ODE step is its step)."""
        return own_solver(self.scheduler)

    def timesteps(self, sigma: Tensor) -> Tensor:
        """The scheduler's timestep of each ``sigma [B]`` of a grid :meth:`sigmas` made (elsewhere ``sigma * 1000``)."""
        return self.timestep_table(sigma)

    def _model_input(self, latents: Tensor, cond: Conditioning) -> Tensor:
        """What the transformer reads besides the timestep and text (image-to-video adds its condition channels)."""
        return latents

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        t = self.timesteps(sigma)
        expert = self.denoiser.expert_index(t)
        timestep = t
        if self.expand_timesteps:  # Wan 2.2 TI2V-5B: one timestep per token (all equal in text-to-video)
            _, p_h, p_w = self.denoiser.config.patch_size
            tokens = latents.shape[2] * (latents.shape[3] // p_h) * (latents.shape[4] // p_w)
            timestep = t[:, None].expand(-1, tokens)
        image_embeds = cond.shared.get("image_embeds")
        with self._autocast():
            out = self.denoiser(self._model_input(latents, cond), timestep, cond.embeds, image_embeds, expert=expert,
                                collective=self._collective())
        return out.float()

    def _collective(self) -> bool:
        """Whether each expert's forward is a collective (FSDP2 over several processes): then every call runs both."""
        if len(self.denoiser.names) < 2 or not torch.distributed.is_initialized():
            return False
        from torch.distributed.fsdp import FSDPModule

        return torch.distributed.get_world_size() > 1 and isinstance(self.denoiser.transformer, FSDPModule)

    def velocity(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 cfg_gradient: str = "both") -> Tensor:
        """The guided velocity; with ``guidance_scale_2``, the low-noise expert's rows are guided by it instead."""
        if self.guidance_scale_2 is None:
            return super().velocity(latents, sigma, cond, guidance_scale, cfg_gradient)
        if not cond.guided or guidance_scale == self.guidance_scale_2 == 1.0:
            return self._forward(latents, sigma, cond.conditional())
        low = self.denoiser.expert_index(self.timesteps(sigma)).bool()
        scale = torch.where(low, self.guidance_scale_2, guidance_scale).to(latents.device)
        v_uncond, v_cond = self.guidance_sides(latents, sigma, cond, cfg_gradient)
        return self.guide(v_uncond, v_cond, scale.view(-1, *[1] * (latents.ndim - 1)))

    # -- videos ------------------------------------------------------------------------------------------------

    def latent_shape(self) -> tuple[int, ...]:
        cfg = self.vae_config
        return (cfg.z_dim, (self.num_frames - 1) // cfg.scale_factor_temporal + 1,
                self.height // cfg.scale_factor_spatial, self.width // cfg.scale_factor_spatial)

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Videos ``[B, F, 3, H, W]`` in ``[0, 1]`` from latents ``[B, C, f, h, w]``, ``vae_chunk_size`` at a time,
        as the pipeline (its ``latents_mean`` / ``latents_std`` undone, then ``postprocess_video``)."""
        cfg = self.vae.config
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(latents.device)
        std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(latents.device)
        # the pipeline decodes without autocast; the VAE's [B, 3, F, H, W] read frame-major
        videos = self.decode_chunks(latents, lambda z: (z.float() * std + mean).to(self.vae.dtype), autocast=False)
        return videos.permute(0, 2, 1, 3, 4)
