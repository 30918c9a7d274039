"""The joint audio-video state of LTX-2 as one flat vector per row: the sizes ``LTX2Pipeline`` derives from its
configs, and the views between the flat state and the transformer's two token sequences.

``LTX2Pipeline`` keeps its latents packed the whole loop: the video as ``[B, F h w, C]`` tokens (``_pack_latents``,
patch size 1 for the published model) and the audio as ``[B, L, C_a M]`` (``_pack_audio_latents``: each latent audio
frame one token of its channels times mel bins). flowrl's state is the two concatenated, ``[B, F h w C + L C_a M]``,
so the sampler's Gaussian steps treat every dimension alike (as the pipeline's Euler step does) and one tensor
carries the pair through rollouts, trees and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class JointLayout:
    """Sizes of one row's joint state: the video's latent grid ``video_grid = (F, h, w)`` in tokens of
    ``video_channels``, the audio's ``audio_frames`` tokens of ``audio_channels``, and the VAE's compression
    (``spatial_ratio``, ``temporal_ratio``).

    >>> layout = JointLayout((3, 2, 2), 4, 5, 4, 2, 2)
    >>> layout.video_tokens, layout.size  # 3 x 2 x 2 tokens of 4, then 5 of 4
    (12, 68)
    >>> import torch; v, a = layout.tokens(torch.arange(68.0)[None]); v.shape, a.shape, a[0, 0].tolist()
    (torch.Size([1, 12, 4]), torch.Size([1, 5, 4]), [48.0, 49.0, 50.0, 51.0])
    """

    video_grid: tuple[int, int, int]
    video_channels: int
    audio_frames: int
    audio_channels: int
    spatial_ratio: int
    temporal_ratio: int

    @property
    def video_tokens(self) -> int:
        f, h, w = self.video_grid
        return f * h * w

    @property
    def video_size(self) -> int:
        return self.video_tokens * self.video_channels

    @property
    def size(self) -> int:
        return self.video_size + self.audio_frames * self.audio_channels

    def split(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, N]`` -> the video part ``[B, F h w C]`` and the audio part ``[B, L C_a M]`` (views)."""
        return state[:, :self.video_size], state[:, self.video_size:]

    def tokens(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, N]`` -> the transformer's ``video [B, F h w, C]`` and ``audio [B, L, C_a M]`` token sequences."""
        video, audio = self.split(state)
        return (video.reshape(len(state), self.video_tokens, self.video_channels),
                audio.reshape(len(state), self.audio_frames, self.audio_channels))

    def flat(self, video: Tensor, audio: Tensor) -> Tensor:
        """The inverse of :meth:`tokens`: ``[B, N]``."""
        import torch

        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)


def vae_ratios(vae_config) -> tuple[int, int]:
    """``(spatial, temporal)`` compression of an ``AutoencoderKLLTX2Video`` config, as its ``__init__`` computes
    them.

    >>> vae_ratios({"patch_size": 4, "patch_size_t": 1, "spatio_temporal_scaling": (True, True, True, False),
    ...             "spatial_compression_ratio": None, "temporal_compression_ratio": None})  # 4 x 2^3, 1 x 2^3
    (32, 8)
    """
    scaled = 2 ** sum(vae_config["spatio_temporal_scaling"])
    spatial = vae_config.get("spatial_compression_ratio") or vae_config["patch_size"] * scaled
    temporal = vae_config.get("temporal_compression_ratio") or vae_config["patch_size_t"] * scaled
    return spatial, temporal


def joint_layout(vae_config, audio_config, height: int, width: int, num_frames: int,
                 frame_rate: float) -> JointLayout:
    """The layout ``LTX2Pipeline.__call__`` gives a ``height x width`` video of ``num_frames`` at ``frame_rate``
    (for a transformer of patch size 1, the published one's): the latent grid of ``prepare_latents`` and ``round(duration x
    sample_rate / hop_length / 4)`` audio latent frames of ``latent_channels x mel_bins / 4`` (``prepare_audio_latents``,
    the audio VAE's fixed 4x compression of time and mel bins)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR

    spatial, temporal = vae_ratios(vae_config)
    grid = ((num_frames - 1) // temporal + 1, height // spatial, width // spatial)
    per_second = audio_config["sample_rate"] / audio_config["mel_hop_length"] / LATENT_DOWNSAMPLE_FACTOR
    audio_frames = round(num_frames / frame_rate * per_second)
    audio_channels = audio_config["latent_channels"] * (audio_config["mel_bins"] // LATENT_DOWNSAMPLE_FACTOR)
    return JointLayout(grid, vae_config["latent_channels"], audio_frames, audio_channels, spatial, temporal)
