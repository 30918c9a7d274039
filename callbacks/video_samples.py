"""Videos people can look at without a video player: a strip of frames (first, middle, last) as a still image, and
an animation file (GIF with Pillow alone; MP4 with the optional ``imageio`` + ``imageio-ffmpeg``,
``pip install 'flowrl[video]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec, frame_indices

#: animation formats: what each needs
FORMATS = {"gif": "Pillow (installed)", "mp4": "imageio and imageio-ffmpeg: pip install 'flowrl[video]'"}


def frame_strip(video: Tensor, frames: FrameSpec = DEFAULT_FRAMES) -> Tensor:
    """The frames ``frames`` picks from ``video [F, 3, H, W]``, side by side: ``[3, H, k W]``.

    >>> frame_strip(torch.arange(5.0)[:, None, None, None].expand(5, 3, 1, 2))[0].tolist()
    [[0.0, 0.0, 2.0, 2.0, 4.0, 4.0]]
    """
    return torch.cat(list(video[frame_indices(frames, video.shape[0])]), dim=-1)


def as_stills(images: Tensor, frames: FrameSpec = DEFAULT_FRAMES) -> Tensor:
    """Images ``[N, 3, H, W]`` as they are; videos ``[N, F, 3, H, W]`` as frame strips ``[N, 3, H, k W]``."""
    if images.ndim == 4:
        return images
    return torch.stack([frame_strip(video, frames) for video in images])


def to_uint8(frames: Tensor) -> np.ndarray:
    """``[..., 3, H, W]`` in ``[0, 1]`` as ``[..., H, W, 3]`` uint8."""
    return (frames.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).movedim(-3, -1).cpu().numpy()


def animation_problem(video_format: str) -> str | None:
    """Why ``video_format`` cannot be written here (an unknown format, a missing optional package), or None."""
    if video_format not in FORMATS:
        return f"video_format={video_format!r}: choose one of {sorted(FORMATS)}"
    if video_format == "mp4":
        try:
            import imageio  # noqa: F401
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            return f"video_format='mp4' needs {FORMATS['mp4']} (or use gif, which needs nothing more)"
    return None


def write_animation(frames: Sequence[np.ndarray], path: Path, fps: int = 8) -> Path:
    """Frames ``[H, W, 3]`` uint8 as an animation at ``path`` (``.gif`` or ``.mp4``, by its suffix); returns it."""
    if path.suffix == ".gif":
        pictures = [Image.fromarray(np.ascontiguousarray(f)) for f in frames]
        pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=round(1000 / fps), loop=0)
        return path
    import imageio.v3 as iio

    # x264 needs even sizes (yuv420p): pad odd ones by one black row or column
    array = np.stack(frames)
    pad = [(0, 0), (0, array.shape[1] % 2), (0, array.shape[2] % 2), (0, 0)]
    iio.imwrite(path, np.pad(array, pad), fps=fps, codec="libx264", plugin="FFMPEG")
    return path
