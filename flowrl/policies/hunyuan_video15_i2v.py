"""HunyuanVideo 1.5 image-to-video (the 480p / 720p I2V checkpoints and their CFG-distilled variants) on the
components of diffusers' ``HunyuanVideo15ImageToVideoPipeline``: the video starts from the first frame each prompt
record gives.

The first frame conditions every evaluation as the pipeline's ``prepare_cond_latents_and_mask`` makes it: the frame,
resized and centre-cropped to the video's size (``resize_mode="crop"``), through the VAE encoder (the distribution's
mode) times ``scaling_factor`` in the first latent frame's condition channels (zeros after it), and a mask channel of
ones on the first latent frame; SigLIP's last hidden states of the same frame are the transformer's vision tokens.
Both are computed once per distinct image (an LRU cache keyed by the image's 8-bit pixels) into
``Conditioning.shared``, so a group and its tree share them and both sides of classifier-free guidance see them.
The pipeline does not overwrite the first latent frame during sampling, so the sampler's transitions are the model's.

The pipeline picks the video's size per image (the bucket of the transformer's ``target_size`` nearest the image's
aspect ratio); a policy trains at one size, so ``height`` x ``width`` must be one of those buckets, and every first
frame is resized and cropped to it, as the pipeline does to its bucket.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import HunyuanVideo15ImageToVideoPipeline
from diffusers.pipelines.hunyuan_video1_5.image_processor import generate_crop_size_list
from torch import Tensor

from flowrl.policies.base import Conditioning
from flowrl.policies.hunyuan_video15 import HunyuanVideo15Policy
from flowrl.policies.pipeline_policy import PromptCache, joined_problems, stacked
from flowrl.policies.source_latents import first_frame_encodings


def bucket_problems(height: int, width: int, target_size: int, spatial: int) -> list[str]:
    """The size when it is not one of the pipeline's buckets for ``target_size`` (``generate_crop_size_list``), with
    the buckets of the nearest aspect ratios.

    >>> bucket_problems(480, 848, 640, 16), bucket_problems(512, 512, 640, 16)[0][:51]
    ([], 'policy.width=512 at policy.height=512 is not a size')
    """
    buckets = generate_crop_size_list(base_size=target_size, patch_size=spatial)
    if (height, width) in buckets:
        return []
    near = sorted(buckets, key=lambda hw: abs(hw[0] / hw[1] - height / width))[:3]
    return [f"policy.width={width} at policy.height={height} is not a size the pipeline generates at (its height x "
            f"width buckets for target_size {target_size}); choose one, e.g. "
            f"{', '.join(f'{h} x {w}' for h, w in near)}"]


class HunyuanVideo15I2VPolicy(HunyuanVideo15Policy):
    """HunyuanVideo 1.5 image-to-video adapter: each prompt takes one conditioning image, its first frame.

    Args:
        model: hub id (``hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v``, ``..._720p_i2v``,
            ``..._480p_i2v_distilled``), local folder or embedded name of a ``HunyuanVideo15ImageToVideoPipeline``
            folder.
        image_cache_size: first-frame encodings kept (LRU; each is ``[C + 1, f, h, w]`` plus the SigLIP tokens).
        every other option: as :class:`~flowrl.policies.hunyuan_video15.HunyuanVideo15Policy`.
    """

    pipeline_class = HunyuanVideo15ImageToVideoPipeline
    conditioning_images = 1

    def __init__(self, model: str = "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v", image_cache_size: int = 64,
                 **kwargs):
        problems = [f"policy.image_cache_size={image_cache_size} must be >= 0 (0 disables the cache)"] \
            if image_cache_size < 0 else []
        # **kwargs passed on unchanged: jsonargparse reads the parent's signature through it (--help, YAML checks)
        with joined_problems(problems):
            super().__init__(model=model, **kwargs)
        self.image_cache = PromptCache(image_cache_size)

    def _conditioning_problems(self) -> list[str]:
        return bucket_problems(self.height, self.width, self.denoiser_config.target_size,
                               self.vae_config.spatial_compression_ratio)

    def _load_conditioning(self, path: str) -> None:
        from transformers import AutoImageProcessor, SiglipVisionModel

        self.image_encoder = SiglipVisionModel.from_pretrained(path, subfolder="image_encoder",
                                                               dtype=self.torch_dtype).eval()
        self.feature_extractor = AutoImageProcessor.from_pretrained(path, subfolder="feature_extractor")

    def components(self) -> dict:
        return {**super().components(), "image_encoder": self.image_encoder,
                "feature_extractor": self.feature_extractor}

    def _image_conditioning(self, images: Optional[list[list[Tensor]]]) -> dict[str, Tensor]:
        """``condition [B, C + 1, f, h, w]`` and ``image_embeds [B, N, D]`` of each row's first frame, each distinct
        frame encoded once."""
        rows = first_frame_encodings(images, self.image_cache, self._encode_image, type(self).__name__)
        return dict(zip(("condition", "image_embeds"), stacked(rows, self.denoiser.device)))

    @torch.no_grad()
    def _encode_image(self, image: Tensor) -> tuple[Tensor, Tensor]:
        """One first frame ``[3, H, W]`` in ``[0, 1]`` through the pipeline's own resize,
        ``prepare_cond_latents_and_mask`` and ``encode_image``."""
        from flowrl.rewards.pil_images import to_pil

        pipe, device = self.pipeline(), self.vae.device
        pil = pipe.video_processor.resize(to_pil(image[None])[0], height=self.height, width=self.width,
                                          resize_mode="crop")
        zeros = torch.zeros(1, *self.latent_shape(), device=device)
        latents, mask = pipe.prepare_cond_latents_and_mask(zeros, pil, 1, self.height, self.width, torch.float32,
                                                           device)
        embeds = pipe.encode_image(pil, 1, device, torch.float32)
        return torch.cat([latents, mask], dim=1)[0], embeds[0]

    def _condition(self, latents: Tensor, cond: Conditioning) -> tuple[Tensor, Tensor]:
        return cond.shared["condition"], cond.shared["image_embeds"]
