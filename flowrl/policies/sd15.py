"""Stable Diffusion 1.x (arXiv 2112.10752) on the components of diffusers' ``StableDiffusionPipeline``: a diffusion
(not flow) model, trained as DDPO does (arXiv 2305.13301) with DDIM and ``eta`` as the stochastic step.

``UNet2DConditionModel`` predicting the noise (``prediction = "epsilon"``), ``CLIPTextModel`` + ``CLIPTokenizer``
(the last hidden state conditions the UNet; SD1.5 has no pooled embedding, so ``Conditioning.pooled`` is
``[B, 0]``), ``AutoencoderKL`` with its scaling factor, and the scheduler config for the alphas, loaded as a
``DDIMScheduler`` (the hub's SD1.5 ships a PNDM config; DDPO converts it the same way).

How an epsilon model fits the loop's ``(z, v, sigma, sigma_next)`` step contract with nothing model-specific in the
methods: the latents are the pipeline's own variance-preserving ``z_t = sqrt(alpha_bar_t) x0 + sqrt(1 -
alpha_bar_t) eps``, ``sigmas(T)`` is the DDIM timestep grid as the noise-to-signal ratio ``sigma_t = sqrt((1 -
alpha_bar_t) / alpha_bar_t)`` (decreasing; the last entry is the scheduler's ``final_alpha_cumprod``, not 0),
``velocity`` returns the (guided) noise prediction, and the ``ddim`` / ``ddim_ode`` steps of
``flowrl.sampling.steps`` do diffusers' DDIM maths on those sigmas. ``_forward`` maps each sigma back to the integer
timestep it came from, so the UNet sees exactly the pipeline's timesteps.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from torch import Tensor
from transformers import CLIPTextModel, CLIPTokenizer

from flowrl.policies.base import Conditioning, LoraOptions
from flowrl.model_paths import resolve_model
from flowrl.policies.component_configs import component_config
from flowrl.policies.pipeline_policy import PipelinePolicy
from flowrl.policies.sd3 import resolution_problem

#: The attention projections DDPO trains (diffusers' SD LoRA attention processors), in self and cross attention.
UNET_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def noise_to_signal(alphas_cumprod: Tensor) -> Tensor:
    """``sqrt((1 - alpha_bar) / alpha_bar)`` in float64, returned as float32 (the sigma of the ``ddim`` step).

    >>> [round(s, 6) for s in noise_to_signal(torch.tensor([0.5, 0.8])).tolist()]  # sqrt(1), sqrt(0.2 / 0.8)
    [1.0, 0.5]
    """
    alphas = alphas_cumprod.double()
    return ((1 - alphas) / alphas).sqrt().float()


class SD15Policy(PipelinePolicy):
    """Stable Diffusion 1.x adapter (epsilon prediction; use ``step_kind: ddim``).

    Args:
        model: hub id (``stable-diffusion-v1-5/stable-diffusion-v1-5``, the mirror of ``runwayml/...``), local
            folder or embedded name of a ``StableDiffusionPipeline`` folder.
        lora: LoRA options (default targets: the UNet's attention projections ``to_q/to_k/to_v/to_out.0``, rank 4
            and alpha 4 as DDPO); None for full fine-tuning.
        resolution: image height and width in pixels (512 for SD1.5).
        torch_dtype, autocast, gradient_checkpointing, vae_chunk_size, prompt_cache_size, activation_offload: see
            :class:`~flowrl.policies.pipeline_policy.PipelinePolicy`.

    Raises:
        ValueError: a resolution the UNet cannot downsample, or a scheduler the ``ddim`` step does not implement
            (a prediction type other than epsilon, thresholding).
    """

    pipeline_class = StableDiffusionPipeline
    default_lora_targets = UNET_LORA_TARGETS
    denoiser_kind = "UNet2DConditionModel"
    denoiser_name = "unet"
    prediction = "epsilon"

    def __init__(self, model: str = "stable-diffusion-v1-5/stable-diffusion-v1-5",
                 lora: Optional[LoraOptions] = LoraOptions(rank=4, alpha=4.0), resolution: int = 512,
                 torch_dtype: str = "float32", autocast: Optional[str] = None, gradient_checkpointing: bool = False,
                 vae_chunk_size: Optional[int] = None, prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, torch_dtype=torch_dtype, autocast=autocast,
                         gradient_checkpointing=gradient_checkpointing, vae_chunk_size=vae_chunk_size,
                         prompt_cache_size=prompt_cache_size, activation_offload=activation_offload)
        self.path = resolve_model(model)
        self.resolution = resolution
        self.vae_config = component_config(AutoencoderKL, self.path, "vae")
        self.denoiser_config = component_config(UNet2DConditionModel, self.path, "unet")
        self.scheduler = DDIMScheduler.from_pretrained(self.path, subfolder="scheduler")
        # StableDiffusionPipeline normalises legacy scheduler configs when it is built (steps_offset 1, clip_sample
        # false, with diffusers' deprecation warning): build one now so the schedule is the pipeline's from the start
        self.pipeline_class(vae=None, text_encoder=None, tokenizer=None, unet=None, scheduler=self.scheduler,
                            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        problems = [p for p in [resolution_problem(
            resolution, self.vae_scale_factor * 2 ** (len(self.denoiser_config.down_block_types) - 1))] if p]
        cfg = self.scheduler.config
        if cfg.prediction_type != "epsilon" or cfg.thresholding:
            problems.append(f"{model}: scheduler prediction_type={cfg.prediction_type!r}, thresholding="
                            f"{cfg.thresholding}; SD15Policy's ddim step implements epsilon prediction without "
                            "thresholding (SD1.x); v-prediction models (SD2.x 768 px) are not supported")
        self.check_problems(problems)
        self._sigma_grid = noise_to_signal(self.scheduler.alphas_cumprod)  # [num_train_timesteps], by timestep

    def _load_weights(self) -> None:
        path, dtype = self.path, self.torch_dtype
        self.vae = AutoencoderKL.from_pretrained(path, subfolder="vae", torch_dtype=dtype).eval()
        self.tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", dtype=dtype).eval()
        self.denoiser = UNet2DConditionModel.from_pretrained(path, subfolder="unet", torch_dtype=self.denoiser_dtype)

    def components(self) -> dict:
        return dict(vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer, unet=self.denoiser,
                    scheduler=self.scheduler, safety_checker=None, feature_extractor=None,
                    requires_safety_checker=False)

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        embeds, _ = self.pipeline().encode_prompt(prompts, device=self.text_encoder.device, num_images_per_prompt=1,
                                                  do_classifier_free_guidance=False)
        return embeds, embeds.new_zeros(len(prompts), 0)

    def timesteps(self, sigma: Tensor) -> Tensor:
        """The training timesteps ``[B]`` long whose noise-to-signal ratio is nearest to ``sigma [B]`` (exact for the
        sigmas of :meth:`sigmas`, which come from the same table)."""
        grid = self._sigma_grid.to(sigma.device)
        return (grid[None, :] - sigma.float()[:, None]).abs().argmin(dim=1)

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        dtype = self.denoiser_dtype
        with self._autocast():
            out = self.denoiser(latents.to(dtype), self.timesteps(sigma), encoder_hidden_states=cond.embeds.to(dtype),
                                return_dict=False)[0]
        return out.float()

    def latent_shape(self) -> tuple[int, ...]:
        size = self.resolution // self.vae_scale_factor
        return (self.denoiser_config.in_channels, size, size)

    def sigmas(self, num_steps: int) -> Tensor:
        """``[T + 1]`` float32 noise-to-signal ratios of the scheduler's DDIM timesteps, then of its final alpha.

        Consecutive timesteps are one DDIM step apart, as diffusers' ``t - num_train_timesteps // T`` for the
        ``leading`` spacing of SD1.5 (and ``trailing`` when ``T`` divides ``num_train_timesteps``).
        """
        self.scheduler.set_timesteps(num_steps)
        final = noise_to_signal(torch.as_tensor(self.scheduler.final_alpha_cumprod).reshape(1))
        return torch.cat([self._sigma_grid[self.scheduler.timesteps.long()], final])
