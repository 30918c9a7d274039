"""LTX-2 image-to-video (``Lightricks/LTX-2``) on the components of diffusers' ``LTX2ImageToVideoPipeline``: the video
starts from the first frame each prompt record gives; video only, the audio held fixed as in
:class:`~flowrl.policies.ltx2.LTX2Policy`.

The pipeline puts the first frame's latents in the first latent frame and keeps them clean through the whole loop:
those tokens read timestep 0 (``timestep x (1 - conditioning_mask)``), and the scheduler steps only the later frames
(``latents[:, :, 1:]``), so the first frame's tokens are never noised and never change. flowrl's sampler noises every
dimension of its state, so the first frame is kept out of it: the sampled state is the joint state of the text-to-video
policy minus its first ``h w C`` values (the first latent frame's packed tokens), and the first frame's tokens ride in
``Conditioning.shared``, put back in front of the state (:meth:`LTX2I2VPolicy._joint`) before every evaluation and
every decode, and cut off the velocity (:meth:`LTX2I2VPolicy._sampled`). The log-probs are thus those of the
pipeline's transitions, over the dimensions it samples.

The first frame is encoded as ``__call__`` encodes it: re-compressed as one H.264 frame at ``image_crf`` (the
pipeline's default for a Gemma-3 text encoder is 33, LTX-2's training compression; it needs PyAV), resized by the
pipeline's ``video_processor``, through the pipeline's own ``prepare_latents`` (the VAE's mode, normalised by the
VAE's statistics); once per distinct image (an LRU cache keyed by the image's 8-bit pixels), shared by a group, its
tree and both sides of CFG.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch
from diffusers import LTX2ImageToVideoPipeline
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.policies.base import Conditioning
from flowrl.policies.ltx2 import LTX2Policy
from flowrl.policies.pipeline_policy import PromptCache, joined_problems, stacked
from flowrl.policies.source_latents import first_frame_encodings

FIRST_FRAME = "first_frame"


def default_crf(path: str) -> int:
    """The pipeline's ``image_crf`` default for the folder's text encoder (``resolve_default_image_crf``: 33 for LTX-2's
    Gemma-3, 18 for LTX-2.5's Gemma-4), read from its config alone."""
    from diffusers.pipelines.ltx2.utils import resolve_default_image_crf
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(path, subfolder="text_encoder")
    return resolve_default_image_crf(SimpleNamespace(config=SimpleNamespace(model_type=config.get("model_type"))))


def crf_problems(image_crf: Optional[int], resolved: int) -> list[str]:
    """What stops the first frame's H.264 re-compression at ``resolved`` (``image_crf`` None: the pipeline's default).

    >>> crf_problems(-1, -1), crf_problems(0, 0)
    (["policy.image_crf=-1 must be >= 0 (0: no re-compression; null: the pipeline's default)"], [])
    """
    from diffusers.utils import is_av_available

    if resolved < 0:
        return [f"policy.image_crf={image_crf} must be >= 0 (0: no re-compression; null: the pipeline's default)"]
    if resolved and not is_av_available():
        return [f"policy.image_crf={image_crf}: the pipeline re-compresses the first frame as one H.264 frame at CRF "
                f"{resolved} (LTX-2's training compression), which needs PyAV; `pip install av`, or set "
                "policy.image_crf: 0 to condition on the frame as given"]
    return []


class LTX2I2VPolicy(LTX2Policy):
    """LTX-2 image-to-video adapter: each prompt takes one conditioning image, its first frame (see the module doc).

    Args:
        model: hub id (``Lightricks/LTX-2``), local folder or embedded name of an ``LTX2ImageToVideoPipeline`` (or
            ``LTX2Pipeline``: the same components) folder.
        image_crf: the first frame's H.264 re-compression (the pipeline's ``image_crf``; None: its default for the
            folder's text encoder, 33 for LTX-2; 0: none).
        image_cache_size: first-frame encodings kept (LRU; each is the first latent frame's ``h w C`` values).
        every other option: as :class:`~flowrl.policies.ltx2.LTX2Policy`.
    """

    pipeline_class = LTX2ImageToVideoPipeline
    conditioning_images = 1

    def __init__(self, model: str = "Lightricks/LTX-2", image_crf: Optional[int] = None, image_cache_size: int = 64,
                 **kwargs):
        self.image_crf = default_crf(resolve_model(model)) if image_crf is None else image_crf
        problems = crf_problems(image_crf, self.image_crf)
        if image_cache_size < 0:
            problems.append(f"policy.image_cache_size={image_cache_size} must be >= 0 (0 disables the cache)")
        # **kwargs passed on unchanged: jsonargparse reads LTX2Policy's signature through it (--help, YAML checks)
        with joined_problems(problems):
            super().__init__(model=model, **kwargs)
        self.image_cache = PromptCache(image_cache_size)
        _, h, w = self.layout.video_grid
        self.first_tokens = h * w  # the first latent frame's packed tokens: the first h w of the video's

    def latent_shape(self) -> tuple[int, ...]:
        """``(N,)``: the text-to-video joint state without the first latent frame's ``h w C`` values."""
        return (self.layout.size - self.first_tokens * self.layout.video_channels,)

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts as :class:`~flowrl.policies.ltx2.LTX2Policy`, and each row's first frame's clean latent tokens
        ``shared["first_frame"] [B, h w C]`` (each distinct frame encoded once)."""
        cond = super().encode(prompts, images)
        rows = first_frame_encodings(images, self.image_cache, self._encode_image, type(self).__name__)
        cond.shared = dict(zip((FIRST_FRAME,), stacked(rows, self.denoiser.device)))
        return cond

    @torch.no_grad()
    def _encode_image(self, image: Tensor) -> tuple[Tensor]:
        """One first frame ``[3, H, W]`` in ``[0, 1]`` as ``LTX2ImageToVideoPipeline.__call__`` reads a PIL image: the
        CRF re-compression, ``video_processor.preprocess`` and ``prepare_latents``; its first ``h w`` tokens."""
        import numpy as np
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf
        from PIL import Image

        from flowrl.rewards.pil_images import to_pil

        pipe, device = self.pipeline(), self.vae.device
        pil = to_pil(image[None])[0]
        if self.image_crf:
            pil = Image.fromarray(apply_image_conditioning_crf(np.array(pil.convert("RGB")), self.image_crf))
        pixels = pipe.video_processor.preprocess(pil, height=self.height, width=self.width).to(device, self.vae.dtype)
        # the generator only draws the noise of the later frames, which is dropped: the global RNG stays untouched
        generator = torch.Generator(device).manual_seed(0)
        latents, _ = pipe.prepare_latents(pixels, 1, self.layout.video_channels, self.height, self.width,
                                          self.num_frames, 0.0, torch.float32, device, generator)
        return (latents[0, :self.first_tokens].flatten(),)

    def _joint(self, latents: Tensor, cond: Optional[Conditioning]) -> Tensor:
        """The first frame's clean tokens, then the sampled state: the joint state of the pipeline's loop."""
        if cond is None or FIRST_FRAME not in cond.shared:
            raise ValueError(f"{type(self).__name__} keeps each row's first frame out of the sampled state: decode and "
                             "evaluate with the rows' conditioning (policy.decode(latents, cond))")
        return torch.cat([cond.shared[FIRST_FRAME].to(latents), latents], dim=1)

    def _sampled(self, joint: Tensor) -> Tensor:
        return joint[:, self.first_tokens * self.layout.video_channels:]

    def _video_timestep(self, t: Tensor) -> Tensor:
        """``[B, F h w]``: the pipeline's ``timestep x (1 - conditioning_mask)``, 0 on the first frame's tokens."""
        moving = torch.ones(self.layout.video_tokens, device=t.device, dtype=t.dtype)
        moving[:self.first_tokens] = 0
        return t[:, None] * moving
