"""Wan image-to-video (Wan 2.1 I2V 14B 480p / 720p, Wan 2.2 I2V A14B) on the components of diffusers'
``WanImageToVideoPipeline``: the video starts from the first frame each prompt record gives.

The first frame conditions the transformer as the pipeline's ``prepare_latents`` makes it: the frame, resized to the
video's size and followed by black frames, through the VAE encoder (the distribution's mode), normalised, with 4 mask
channels marking the first latent frame; these 20 channels are concatenated to the 16 latent channels at every
evaluation. Wan 2.1's I2V transformer also reads the CLIP image encoder's penultimate hidden states
(``encode_image``). Both are computed once per distinct image (an LRU cache keyed by the image's 8-bit pixels) into
``Conditioning.shared``, so a group and its tree share them, and both sides of classifier-free guidance see them.
The frame is read as 8-bit pixels, exactly as the pipeline reads a PIL image.

Not covered: Wan 2.2 TI2V-5B's image-to-video (it overwrites the first latent frame with the image at every step
and at the end, which the sampler's transitions and log-probs would not see), and first-last-frame conditioning.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import WanImageToVideoPipeline
from torch import Tensor

from flowrl.policies.base import Conditioning
from flowrl.policies.pipeline_policy import PromptCache, joined_problems, stacked
from flowrl.policies.source_latents import first_frame_encodings
from flowrl.policies.wan import WanPolicy

#: the text tokens Wan 2.1's I2V attention expects (diffusers' WanAttnProcessor splits image tokens off by it)
I2V_TEXT_TOKENS = 512


class WanI2VPolicy(WanPolicy):
    """Wan image-to-video adapter: each prompt takes one conditioning image, its first frame.

    Args:
        model: hub id (``Wan-AI/Wan2.1-I2V-14B-480P-Diffusers``, ``Wan-AI/Wan2.2-I2V-A14B-Diffusers``), local
            folder or embedded name of a ``WanImageToVideoPipeline`` folder.
        image_cache_size: first-frame encodings kept (LRU; each is ``[20, f, h, w]`` plus the CLIP tokens).
        every other option: as :class:`~flowrl.policies.wan.WanPolicy`.
    """

    pipeline_class = WanImageToVideoPipeline
    conditioning_images = 1

    def __init__(self, model: str = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", image_cache_size: int = 64, **kwargs):
        problems = [f"policy.image_cache_size={image_cache_size} must be >= 0 (0 disables the cache)"] \
            if image_cache_size < 0 else []
        # **kwargs passed on unchanged: jsonargparse reads WanPolicy's signature through it (--help, YAML checks)
        with joined_problems(problems):
            super().__init__(model=model, **kwargs)
        self.image_cache = PromptCache(image_cache_size)

    def _conditioning_problems(self, index: dict) -> list[str]:
        if index.get("expand_timesteps"):
            return [f"policy.model={self.path} is a Wan 2.2 TI2V-5B pipeline (expand_timesteps): its image-to-video "
                    "overwrites the first latent frame at every step, which flowrl's sampler does not model; use "
                    "flowrl.policies.WanPolicy for its text-to-video"]
        has_encoder = (index.get("image_encoder") or [None])[0] is not None
        if has_encoder and self.max_sequence_length != I2V_TEXT_TOKENS:
            return [f"policy.max_sequence_length={self.max_sequence_length}: Wan 2.1's image-to-video transformer "
                    f"splits its context after {I2V_TEXT_TOKENS} text tokens; set it to {I2V_TEXT_TOKENS}"]
        return []

    def _load_conditioning(self, path: str, index: dict) -> None:
        from transformers import AutoImageProcessor, CLIPVisionModel

        has_encoder = (index.get("image_encoder") or [None])[0] is not None
        self.image_encoder = CLIPVisionModel.from_pretrained(
            path, subfolder="image_encoder", dtype=self.torch_dtype).eval() if has_encoder else None
        self.image_processor = AutoImageProcessor.from_pretrained(path, subfolder="image_processor") \
            if has_encoder else None

    def components(self) -> dict:
        return {**super().components(), "image_encoder": self.image_encoder, "image_processor": self.image_processor}

    def _image_conditioning(self, images: Optional[list[list[Tensor]]]) -> dict[str, Tensor]:
        """``condition [B, 4 + C, f, h, w]`` and, with an image encoder, ``image_embeds [B, N, D]`` of each row's
        first frame, each distinct frame encoded once."""
        rows = first_frame_encodings(images, self.image_cache, self._encode_image, type(self).__name__)
        names = ["condition"] + (["image_embeds"] if self.image_encoder is not None else [])
        return dict(zip(names, stacked(rows, self.denoiser.device)))

    @torch.no_grad()
    def _encode_image(self, image: Tensor) -> tuple[Tensor, ...]:
        """One first frame ``[3, H, W]`` in ``[0, 1]`` through the pipeline's own ``prepare_latents`` (its
        ``condition``) and ``encode_image``."""
        from flowrl.rewards.pil_images import to_pil

        pipe, device = self.pipeline(), self.vae.device
        pil = to_pil(image[None])[0]
        pixels = pipe.video_processor.preprocess(pil, height=self.height, width=self.width).to(device, torch.float32)
        zeros = torch.zeros(1, *self.latent_shape(), device=device)
        _, condition = pipe.prepare_latents(pixels, 1, self.vae.config.z_dim, self.height, self.width,
                                            self.num_frames, torch.float32, device, None, zeros)
        if self.image_encoder is None:
            return (condition[0],)
        return condition[0], pipe.encode_image(pil, device)[0]

    def _model_input(self, latents: Tensor, cond: Conditioning) -> Tensor:
        return torch.cat([latents, cond.shared["condition"].to(latents.dtype)], dim=1)
