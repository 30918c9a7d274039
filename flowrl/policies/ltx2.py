"""LTX-2 text-to-video (``Lightricks/LTX-2``) on the components of diffusers' ``LTX2Pipeline``: video only, the audio
branch sampled with it and never trained.

LTX-2's transformer denoises a video and its soundtrack jointly: every block runs the video tokens and the audio
tokens side by side and lets each read the other (``audio_to_video_attn``, ``video_to_audio_attn``), so the video's
velocity depends on the audio latents at the same step. The policy's state is therefore the pair, as the pipeline
samples it: one flat vector per row, the packed video tokens ``[F h w, C]`` then the packed audio tokens
``[L, C_a M]`` (:class:`~flowrl.policies.ltx2_layout.JointLayout`). The sampler, its SDE steps and log-probs run on it
unchanged (a log-prob averages over every dimension, audio included: the exact density of the joint transition). The
audio is held fixed in the sense that matters for video RL: its weights (audio attention, audio feed-forward, the
cross-modal attention) carry no LoRA, by default (the video-only targets of Lightricks' ``ltx-trainer``), and it is
never decoded or rewarded; it changes during training only through what it reads of the trained video stream.

Each step as ``LTX2Pipeline.__call__``: prompts through Gemma-3 (every hidden state, left-padded to
``max_sequence_length``) and the pipeline's ``connectors`` (one embedding for video, one for audio, and the mask);
the ``linspace(1, 1/T, T)`` grid shifted by ``mu`` of the video's token count (its ``calculate_shift`` bounds, then
the scheduler's terminal stretch); the transformer called with the scheduler's timesteps and the pipeline's RoPE
coordinates; CFG on ``negative_prompt`` in x0 space per modality (``audio_guidance_scale`` for the audio), with the
pipeline's guidance rescale; decoding by ``_unpack_latents``, ``_denormalize_latents`` and the video VAE.

Not modelled: spatio-temporal guidance and modality-isolation guidance (each an extra forward per step; the policy is
the pipeline at ``stg_scale=0``, ``modality_scale=1``), prompt enhancement and the LTX-2.5 duration head (the
video's length is ``num_frames``), and a VAE with timestep conditioning (refused before loading). Image-to-video is
:class:`~flowrl.policies.ltx2_i2v.LTX2I2VPolicy`: its sampled state leaves the clean first latent frame out, which
the hooks ``_joint`` / ``_sampled`` / ``_video_timestep`` put back around every evaluation and every decode.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, DiffusionPipeline,
                       FlowMatchEulerDiscreteScheduler, LTX2Pipeline, LTX2VideoTransformer3DModel)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, rescale_noise_cfg
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.policies.component_configs import component_config
from flowrl.policies.flow_sigmas import linear_grid, pipeline_sigmas
from flowrl.policies.ltx2_layout import JointLayout, joint_layout, vae_ratios
from flowrl.policies.padded_prompts import MASK
from flowrl.policies.pipeline_policy import PipelinePolicy
from flowrl.policies.wan import video_size_problems

#: the video stream's self- and text cross-attention projections: Lightricks' ltx-trainer's video-only LoRA targets
#: (packages/ltx-trainer/docs/configuration-reference.md); peft's suffix match leaves ``audio_attn1`` / ``audio_attn2``
#: and the cross-modal attention out
LTX2_LORA_TARGETS = tuple(f"{attn}.{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v", "to_out.0"))
#: ``LTX2Pipeline.__call__``'s ``calculate_shift`` bounds where the scheduler config has none
SHIFT_DEFAULTS = {"base_image_seq_len": 1024, "max_image_seq_len": 4096, "base_shift": 0.95, "max_shift": 2.05}
#: ``LTX2Pipeline.check_inputs``: the pixel size must be a multiple of 32 whatever the VAE
PIXEL_MULTIPLE = 32
AUDIO = "audio_embeds"


def ltx2_problems(index: dict, transformer_config, vae_config, max_sequence_length: int, frame_rate: float,
                  pipelines: tuple[str, ...] = ("LTX2Pipeline", "LTX2ImageToVideoPipeline")) -> list[str]:
    """The problems of an LTX-2 folder and the policy's text and timing options, from configs alone.

    >>> found = ltx2_problems({"_class_name": "WanPipeline"}, {"patch_size": 1, "patch_size_t": 1},
    ...                       {"timestep_conditioning": True}, 0, 24.0)
    >>> [line.split()[0] for line in found]
    ['policy.model:', 'policy.model:', 'policy.max_sequence_length=0']
    """
    problems = []
    if (name := index.get("_class_name", "?")) not in pipelines:
        problems.append(f"policy.model: its model_index.json names {name}, not one of {list(pipelines)}; load it "
                        "with its own family's policy")
    if (transformer_config.get("patch_size"), transformer_config.get("patch_size_t")) != (1, 1):
        problems.append("policy.model: its transformer patches latents (patch_size "
                        f"{transformer_config.get('patch_size')}, patch_size_t {transformer_config.get('patch_size_t')}"
                        "); LTX2Policy reads them unpatched as the published LTX-2 (patch size 1)")
    if vae_config.get("timestep_conditioning"):
        problems.append("policy.model: its video VAE decodes with timestep conditioning (decode_timestep / "
                        "decode_noise_scale), which LTX2Policy does not model; use a folder whose VAE has "
                        "timestep_conditioning false (Lightricks/LTX-2's)")
    if max_sequence_length < 1:
        problems.append(f"policy.max_sequence_length={max_sequence_length} must be >= 1 (the pipeline's 1024)")
    if frame_rate <= 0:
        problems.append(f"policy.frame_rate={frame_rate} must be > 0 (the pipeline's 24.0)")
    return problems


class LTX2Policy(PipelinePolicy):
    """LTX-2 text-to-video adapter (video only; see the module doc for the audio).

    Args:
        model: hub id (``Lightricks/LTX-2``), local folder or embedded name of an ``LTX2Pipeline`` folder.
        lora: LoRA options (default targets: ``LTX2_LORA_TARGETS``, the video stream's attention); None for full
            fine-tuning of the whole transformer (both streams).
        height, width, num_frames: the video's size (a multiple of 32 px; ``num_frames = 1 + 8k`` for the published
            VAE); frame_rate: its frames per second (the RoPE's time axis and the soundtrack's length).
        max_sequence_length: Gemma tokens per prompt (the pipeline's 1024).
        negative_prompt: the unconditional side of CFG ("" as the pipeline's default).
        audio_guidance_scale: the audio tokens' CFG scale (the pipeline's default 7.0; None: the method's
            ``guidance_scale``, as the pipeline reads None); guidance_rescale, audio_guidance_rescale: the pipeline's
            x0 rescale (0.7; None: the video's).
        use_cross_timestep: the pipeline's option (True, its default: each stream's cross-modal modulation reads the
            other stream's timestep).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.
    """

    pipeline_class = LTX2Pipeline
    default_lora_targets = LTX2_LORA_TARGETS
    denoiser_kind = "LTX2VideoTransformer3DModel"

    def __init__(self, model: str = "Lightricks/LTX-2", lora: Optional[LoraOptions] = LoraOptions(rank=32, alpha=32.0),
                 height: int = 512, width: int = 768, num_frames: int = 121, frame_rate: float = 24.0,
                 max_sequence_length: int = 1024, negative_prompt: str = "",
                 audio_guidance_scale: Optional[float] = 7.0, guidance_rescale: float = 0.7,
                 audio_guidance_rescale: Optional[float] = None, use_cross_timestep: bool = True,
                 torch_dtype: str = "float32", autocast: Optional[str] = None, gradient_checkpointing: bool = False,
                 vae_chunk_size: Optional[int] = 1, prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.index = DiffusionPipeline.load_config(self.path)
        self.denoiser_config = component_config(LTX2VideoTransformer3DModel, self.path, "transformer")
        self.vae_config = component_config(AutoencoderKLLTX2Video, self.path, "vae")
        audio_config = component_config(AutoencoderKLLTX2Audio, self.path, "audio_vae")
        self.height, self.width, self.num_frames, self.frame_rate = height, width, num_frames, frame_rate
        self.max_sequence_length, self.negative_prompt = max_sequence_length, negative_prompt
        self.audio_guidance_scale, self.use_cross_timestep = audio_guidance_scale, use_cross_timestep
        self.guidance_rescale = guidance_rescale
        self.audio_guidance_rescale = guidance_rescale if audio_guidance_rescale is None else audio_guidance_rescale
        spatial, temporal = vae_ratios(self.vae_config)
        problems = video_size_problems(height, width, num_frames, math.lcm(PIXEL_MULTIPLE, spatial), temporal)
        problems += ltx2_problems(self.index, self.denoiser_config, self.vae_config, max_sequence_length, frame_rate)
        for key, value in (("guidance_rescale", guidance_rescale), ("audio_guidance_rescale", audio_guidance_rescale)):
            if value is not None and not 0.0 <= value <= 1.0:
                problems.append(f"policy.{key}={value} must be in [0, 1] (0: no rescale; the pipeline's 0.7)")
        self.check_problems(problems)
        self.layout: JointLayout = joint_layout(self.vae_config, audio_config, height, width, num_frames, frame_rate)
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(self.path, subfolder="scheduler")

    def _load_weights(self) -> None:
        from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

        path, dtype = self.path, self.torch_dtype
        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.text_encoder = Gemma3ForConditionalGeneration.from_pretrained(path, subfolder="text_encoder",
                                                                           dtype=dtype).eval()
        self.connectors = LTX2TextConnectors.from_pretrained(path, subfolder="connectors", torch_dtype=dtype).eval()
        # the VAE in float32 (as Wan's); the audio VAE and vocoder only complete the pipeline an export writes
        self.vae = AutoencoderKLLTX2Video.from_pretrained(path, subfolder="vae", torch_dtype=torch.float32).eval()
        self.audio_vae = AutoencoderKLLTX2Audio.from_pretrained(path, subfolder="audio_vae", torch_dtype=dtype).eval()
        self.vocoder = self._load_vocoder(path, dtype)
        self.denoiser = LTX2VideoTransformer3DModel.from_pretrained(path, subfolder="transformer",
                                                                    torch_dtype=self.denoiser_dtype)

    def _load_vocoder(self, path: str, dtype: torch.dtype) -> torch.nn.Module:
        """The vocoder of the class ``model_index.json`` names (LTX-2's ``LTX2Vocoder``, later releases' with BWE)."""
        from diffusers.pipelines.ltx2 import vocoder

        name = (self.index.get("vocoder") or [None, "LTX2Vocoder"])[1]
        return getattr(vocoder, name).from_pretrained(path, subfolder="vocoder", torch_dtype=dtype).eval()

    def components(self) -> dict:
        return dict(scheduler=self.scheduler, vae=self.vae, audio_vae=self.audio_vae, text_encoder=self.text_encoder,
                    tokenizer=self.tokenizer, connectors=self.connectors, transformer=self.denoiser,
                    vocoder=self.vocoder)

    # -- prompts -----------------------------------------------------------------------------------------------

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor, Tensor, Tensor]:
        """``(video [n, L, D], audio [n, L, D_a], mask [n, L])``: the pipeline's ``encode_prompt`` (Gemma's stacked
        hidden states, left-padded to ``max_sequence_length``), then its ``connectors`` as its ``__call__`` runs
        them. Every prompt is padded to the same length, so a row's encoding does not depend on its batch."""
        pipe, device = self.pipeline(), self.text_encoder.device
        embeds, mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False,
                                                max_sequence_length=self.max_sequence_length, device=device)
        side = getattr(self.tokenizer, "padding_side", "left")
        video, audio, mask = self.connectors(embeds.to(self.connectors.dtype), mask, padding_side=side)
        return video, audio, mask

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts and ``negative_prompt`` (CFG's other side), each with its audio embedding and mask."""
        self.check_images(images)
        video, audio, mask = self._encoded(list(prompts))
        null_video, null_audio, null_mask = self._encoded([self.negative_prompt] * len(prompts))
        return Conditioning(video, None, null_video, None, extra={AUDIO: audio, MASK: mask},
                            null_extra={AUDIO: null_audio, MASK: null_mask})

    # -- the denoiser ------------------------------------------------------------------------------------------

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 as ``LTX2Pipeline``: ``linspace(1, 1/T, T)`` with ``mu`` of the video's tokens (the
        pipeline's ``calculate_shift`` and bounds), through the scheduler (its shift and terminal stretch), then 0."""
        cfg = self.scheduler.config
        mu = calculate_shift(self.layout.video_tokens, *(cfg.get(key, value) for key, value in SHIFT_DEFAULTS.items()))
        return pipeline_sigmas(self.scheduler, num_steps, linear_grid(num_steps), mu)

    def _joint(self, latents: Tensor, cond: Optional[Conditioning]) -> Tensor:
        """The joint state ``[B, layout.size]`` the transformer and the VAE read, from the sampled state (text-to-video:
        the same tensor)."""
        return latents

    def _sampled(self, joint: Tensor) -> Tensor:
        """The sampled part of a joint ``[B, layout.size]`` tensor (text-to-video: all of it)."""
        return joint

    def _video_timestep(self, t: Tensor) -> Tensor:
        """The video tokens' timestep (text-to-video: one per row, ``[B]``, the audio's)."""
        return t

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        """One evaluation on the joint state ``latents [B, layout.size]``: the joint velocity."""
        layout, dtype, b = self.layout, self.denoiser_dtype, len(latents)
        video, audio = layout.tokens(latents)
        t = sigma.float() * self.scheduler.config.num_train_timesteps  # the scheduler's timesteps, both streams'
        f, h, w = layout.video_grid
        # the RoPE coordinates as the pipeline precomputes them (the transformer's own rope modules)
        video_coords = self.denoiser.rope.prepare_video_coords(b, f, h, w, latents.device, fps=self.frame_rate)
        audio_coords = self.denoiser.audio_rope.prepare_audio_coords(b, layout.audio_frames, latents.device)
        mask = cond.extra[MASK]
        with self._autocast():
            out_video, out_audio = self.denoiser(
                hidden_states=video.to(dtype), audio_hidden_states=audio.to(dtype),
                encoder_hidden_states=cond.embeds.to(dtype), audio_encoder_hidden_states=cond.extra[AUDIO].to(dtype),
                timestep=self._video_timestep(t), audio_timestep=t, sigma=t, encoder_attention_mask=mask,
                audio_encoder_attention_mask=mask, num_frames=f, height=h, width=w, fps=self.frame_rate,
                audio_num_frames=layout.audio_frames, video_coords=video_coords, audio_coords=audio_coords,
                use_cross_timestep=self.use_cross_timestep, return_dict=False)
        return layout.flat(out_video.float(), out_audio.float())

    def velocity(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 cfg_gradient: str = "both") -> Tensor:
        """The velocity; with ``guidance_scale != 1``, ``LTX2Pipeline``'s CFG: per modality, in x0 space (``x0 = z -
        sigma v``), ``x0_c + (g - 1)(x0_c - x0_u)`` rescaled towards ``x0_c``'s std by the guidance rescale, back to a
        velocity; the audio tokens with ``audio_guidance_scale``. Computed on the joint state (the rescale's std
        reads every video token, an image-to-video's clean first frame included), returned on the sampled part."""
        joint = self._joint(latents, cond)
        if guidance_scale == 1.0 or not cond.guided:
            return self._sampled(self._forward(joint, sigma, cond.conditional()))
        v_uncond, v_cond = self.guidance_sides(joint, sigma, cond, cfg_gradient)
        s = sigma.float().view(-1, 1)
        scales = (guidance_scale, self.audio_guidance_scale or guidance_scale)
        rescales = (self.guidance_rescale, self.audio_guidance_rescale)
        parts = [x0_guided(z, u, c, s, g, r) for z, u, c, g, r in zip(
            self.layout.split(joint), self.layout.split(v_uncond), self.layout.split(v_cond), scales, rescales)]
        return self._sampled(torch.cat(parts, dim=1))

    # -- videos ------------------------------------------------------------------------------------------------

    def latent_shape(self) -> tuple[int, ...]:
        """``(N,)``: the video's ``F h w C`` dimensions then the audio's ``L C_a M`` (see the module doc)."""
        return (self.layout.size,)

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Videos ``[B, F, 3, H, W]`` in ``[0, 1]`` from the sampled latents (``cond``: their rows', where the joint
        state needs it; the audio part is dropped), as the pipeline: ``_unpack_latents``, ``_denormalize_latents``
        with the VAE's statistics, the VAE, ``[-1, 1] -> [0, 1]``; ``vae_chunk_size`` videos at a time, without
        autocast."""
        cfg, pipe = self.vae.config, self.pipeline_class
        f, h, w = self.layout.video_grid
        latents = self._joint(latents, cond)

        def vae_input(z: Tensor) -> Tensor:
            grid = pipe._unpack_latents(self.layout.tokens(z.float())[0], f, h, w)
            return pipe._denormalize_latents(grid, self.vae.latents_mean, self.vae.latents_std,
                                             cfg.scaling_factor).to(self.vae.dtype)

        return self.decode_chunks(latents, vae_input, autocast=False).permute(0, 2, 1, 3, 4)


def x0_guided(z: Tensor, v_uncond: Tensor, v_cond: Tensor, sigma: Tensor, scale: float, rescale: float) -> Tensor:
    """``LTX2Pipeline``'s guided velocity of one modality: CFG on the x0 predictions, ``rescale_noise_cfg`` towards
    the conditional x0, back to a velocity. ``z, v_* [B, N]``, ``sigma [B, 1]``.

    >>> z, s = torch.ones(1, 2), torch.tensor([[0.5]])
    >>> x0_guided(z, torch.zeros(1, 2), torch.ones(1, 2), s, 3.0, 0.0)  # without rescale: v_u + g (v_c - v_u)
    tensor([[3., 3.]])
    """
    x0_cond, x0_uncond = z - sigma * v_cond, z - sigma * v_uncond
    x0 = x0_cond + (scale - 1) * (x0_cond - x0_uncond)
    if rescale > 0:
        x0 = rescale_noise_cfg(x0, x0_cond, guidance_rescale=rescale)
    return (z - x0) / sigma
