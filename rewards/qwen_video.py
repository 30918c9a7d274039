"""A generated clip as Qwen2-VL / Qwen2.5-VL video input, the way the learned video rewards' authors feed their
judges: which frames are kept, the size they are resized to, and the patches, tokens and positions the model reads.

The authors read an mp4 with ``qwen_vl_utils`` (VideoAlign ships a modified copy, ``vision_process.py``;
VideoScore2 calls the package): ``smart_nframes`` keeps ``round(F / clip_fps * fps)`` frames (clamped to
``[min_frames, min(max_frames, F)]``, rounded to an even count) or a fixed ``nframes``, taken at
``linspace(0, F - 1, n).round()``; ``fetch_video`` resizes them (bicubic, antialiased, on ``uint8`` frames) to
``smart_resize(H, W, 28, min_pixels, max_pixels)``. A flowrl clip arrives as pixels ``[F, 3, H, W]`` in ``[0, 1]``
with no container, so its frame rate is an option (``clip_fps``: the policy's, 16 for Wan) and the frames are
quantised to 8 bits first, as a decoded mp4's are.

The patches are transformers' own layout (``Qwen2VLVideoProcessor.patchify``: ``temporal_patch_size`` frames, 14 px
patches merged 2 x 2); that processor imports torchvision, which flowrl does not depend on, so the reshape is done
here and checked against the image processor's ``patchify`` of a still clip (tests). Normalisation and patch sizes
come from the checkpoint's ``preprocessor_config.json`` (:class:`VideoPatching`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

FRAME_FACTOR = 2  # qwen_vl_utils: frame counts are even (one temporal patch holds 2 frames)
VIDEO_MIN_PIXELS = 128 * 28 * 28  # qwen_vl_utils' per-frame minimum for videos
VIDEO_PAD = "<|video_pad|>"


def frame_count(num_frames: int, clip_fps: float, fps: Optional[float] = 2.0, nframes: Optional[int] = None,
                min_frames: int = 4, max_frames: int = 768) -> int:
    """How many frames ``qwen_vl_utils.smart_nframes`` keeps of a clip of ``num_frames`` at ``clip_fps``: ``nframes``
    rounded to even, else ``num_frames / clip_fps * fps`` clamped to ``[min_frames, min(max_frames, num_frames)]``
    (bounds rounded up / down to even) and rounded to even; never more than the clip has.

    >>> frame_count(81, clip_fps=16, fps=2.0)  # 81 / 16 * 2 = 10.1 -> 10
    10
    >>> frame_count(33, clip_fps=16, fps=2.0), frame_count(9, clip_fps=16, fps=2.0)  # 4.1 -> 4; 1.1 -> min 4
    (4, 4)
    >>> frame_count(81, clip_fps=16, fps=None, nframes=9)  # round(9 / 2) * 2 (Python rounds 4.5 to even)
    8

    Raises:
        ValueError: fewer than 2 frames would be kept (a clip of 1 frame, or ``nframes`` < 2).
    """
    if nframes is not None:
        count = round(nframes / FRAME_FACTOR) * FRAME_FACTOR
    else:
        low = math.ceil(min_frames / FRAME_FACTOR) * FRAME_FACTOR
        high = math.floor(min(max_frames, num_frames) / FRAME_FACTOR) * FRAME_FACTOR
        count = round(min(max(num_frames / clip_fps * fps, low), high) / FRAME_FACTOR) * FRAME_FACTOR
    count = min(count, num_frames)
    if not FRAME_FACTOR <= count <= num_frames:
        raise ValueError(f"a clip of {num_frames} frames gives {count} frames to score; the video judges need at least "
                         f"{FRAME_FACTOR} (generate longer clips, or set nframes >= {FRAME_FACTOR})")
    return count


def sampled_frames(num_frames: int, clip_fps: float, fps: Optional[float] = 2.0, nframes: Optional[int] = None,
                   min_frames: int = 4, max_frames: int = 768) -> list[int]:
    """The frame indices ``qwen_vl_utils`` reads (uniform sampling): ``linspace(0, F - 1, n).round()`` with ``n`` from
    :func:`frame_count`.

    >>> sampled_frames(81, clip_fps=16, fps=2.0)  # 10 frames spread over 0..80
    [0, 9, 18, 27, 36, 44, 53, 62, 71, 80]
    >>> sampled_frames(9, clip_fps=16, fps=2.0)
    [0, 3, 5, 8]
    """
    count = frame_count(num_frames, clip_fps, fps, nframes, min_frames, max_frames)
    return torch.linspace(0, num_frames - 1, count).round().long().tolist()


def frame_size(height: int, width: int, min_pixels: int = VIDEO_MIN_PIXELS, max_pixels: int = 768 * 28 * 28,
               factor: int = 28) -> tuple[int, int]:
    """The size frames are resized to: transformers' ``smart_resize`` (multiples of ``factor``, area within
    ``[min_pixels, max_pixels]``, the aspect kept), the rule ``qwen_vl_utils.fetch_video`` applies.

    >>> frame_size(480, 832, max_pixels=200704)  # VideoReward's max_frame_pixels (256 x 28 x 28)
    (336, 588)
    >>> frame_size(32, 48, min_pixels=28 * 28, max_pixels=56 * 56)
    (28, 56)
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def resize_frames(frames: Tensor, size: tuple[int, int]) -> Tensor:
    """``frames [n, 3, H, W]`` in ``[0, 1]`` as 8-bit pixels resized to ``size`` (bicubic, antialiased, rounded back to
    8 bits as torchvision does for ``uint8`` frames), float ``[n, 3, h, w]`` in ``[0, 255]``."""
    pixels = (frames.float().clamp(0, 1) * 255).round()
    if tuple(pixels.shape[-2:]) != tuple(size):
        pixels = F.interpolate(pixels, size=size, mode="bicubic", antialias=True, align_corners=False)
    return pixels.round().clamp(0, 255)


@dataclass
class VideoPatching:
    """The processor settings the video patches need (from a checkpoint's ``preprocessor_config.json``)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    @classmethod
    def from_pretrained(cls, folder: str) -> "VideoPatching":
        """Read from a model folder's image processor (the video processor uses the same values)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
        return cls(tuple(processor.image_mean), tuple(processor.image_std), processor.patch_size,
                   processor.temporal_patch_size, processor.merge_size)

    def patchify(self, pixels: Tensor) -> tuple[Tensor, list[int]]:
        """``pixels [n, 3, h, w]`` in ``[0, 255]`` -> normalised patches ``[t * gh * gw, 3 * tps * p * p]`` and the
        grid ``[t, gh, gw]``, in ``Qwen2VLVideoProcessor.patchify``'s order (an odd last frame repeated)."""
        mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.std).view(1, 3, 1, 1)
        video = (pixels / 255 - mean) / std
        tps, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        if pad := -video.shape[0] % tps:
            video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
        n, c, h, w = video.shape
        t, gh, gw = n // tps, h // p, w // p
        patches = video.reshape(t, tps, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return patches.reshape(t * gh * gw, c * tps * p * p), [t, gh, gw]

    def tokens_per_video(self, grid: list[int]) -> int:
        """The ``<|video_pad|>`` tokens one video takes: its patches over ``merge_size ** 2``."""
        return math.prod(grid) // self.merge_size ** 2


def video_batch(clips: list[Tensor], texts: list[str], tokenizer, patching: VideoPatching, padding_side: str,
                fps: Optional[float] = None) -> dict[str, Any]:
    """Model inputs for chat ``texts`` that each hold one ``<|video_pad|>`` and the matching resized ``clips``
    ``[n, 3, h, w]`` in ``[0, 255]``: the processor's output, built without its torchvision half (each video's pad
    token repeated :meth:`VideoPatching.tokens_per_video` times, ``mm_token_type_ids`` 2 on video tokens, and for
    Qwen2.5-VL ``second_per_grid_ts = temporal_patch_size / fps`` when ``fps`` is given)."""
    patches, grids = zip(*(patching.patchify(clip) for clip in clips))
    expanded = []
    for text, grid in zip(texts, grids):
        if text.count(VIDEO_PAD) != 1:
            raise ValueError(f"the chat text must hold one {VIDEO_PAD} (the chat template's video item); "
                             f"it holds {text.count(VIDEO_PAD)}")
        expanded.append(text.replace(VIDEO_PAD, VIDEO_PAD * patching.tokens_per_video(grid)))
    tokenizer.padding_side = padding_side
    batch = dict(tokenizer(expanded, padding=True, return_tensors="pt"))
    video_id = tokenizer.convert_tokens_to_ids(VIDEO_PAD)
    batch["mm_token_type_ids"] = (batch["input_ids"] == video_id).int() * 2
    batch["pixel_values_videos"] = torch.cat(patches)
    batch["video_grid_thw"] = torch.tensor(grids, dtype=torch.long)
    if fps is not None:
        batch["second_per_grid_ts"] = torch.full((len(clips),), patching.temporal_patch_size / fps)
    return batch
