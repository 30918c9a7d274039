"""A grid of training samples with their prompts and rewards, written every N steps (PNG + TensorBoard).

Videos ``[B, F, 3, H, W]`` appear as strips of frames (``frames``: first, middle and last by default) in the PNG, so
no codec is needed to look at them, and as an animation of the whole grid (``video_format``: ``gif`` with Pillow
alone, ``mp4`` with ``flowrl[video]``; None: none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np
from lightning.pytorch import Callback
from PIL import Image, ImageDraw
from torch import Tensor

from flowrl.callbacks.video_samples import animation_problem, as_stills, to_uint8, write_animation
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec, frames_problem


def fitted_lines(text: str, width: float, measure: Callable[[str], float], max_lines: int = 4) -> list[str]:
    r"""``text`` (``\n``-separated parts) wrapped at spaces into lines ``measure`` finds at most ``width`` wide; a word
    wider than a line is broken, and text past ``max_lines`` ends the last line in an ellipsis.

    >>> fitted_lines("green 1 and yellow 4\nalignment 0.93", 11, len), fitted_lines("abcdefgh", 3, len, max_lines=2)
    (['green 1 and', 'yellow 4', 'alignment', '0.93'], ['abc', '...'])
    """
    lines: list[str] = []
    for part in text.split("\n"):
        line = ""
        for word in part.split(" "):
            candidate = f"{line} {word}" if line else word
            if measure(candidate) <= width or not line:
                line = candidate
            else:
                lines.append(line)
                line = word
            while measure(line) > width and len(line) > 1:  # one word wider than the cell: break it
                cut = max([i for i in range(1, len(line)) if measure(line[:i]) <= width], default=1)
                lines.append(line[:cut])
                line = line[cut:]
        lines.append(line)
    if len(lines) > max_lines:
        last = lines[max_lines - 1]
        while last and measure(last + "...") > width:
            last = last[:-1]
        lines = [*lines[:max_lines - 1], last + "..."]
    return lines


def grid_image(images: Tensor, captions: list[str], columns: int = 4, cell: int = 96) -> Image.Image:
    """Images ``[N, 3, H, W]`` in ``[0, 1]`` as one PIL grid, each upscaled (nearest) to ``cell`` px high (and
    ``cell * W / H`` wide: square images fill square cells, frame strips wide ones) with its caption underneath,
    wrapped to the cell's width (every caption whole, up to 4 lines)."""
    rows = -(-len(captions) // columns)
    width = max(1, round(cell * images.shape[-1] / images.shape[-2]))
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength
    wrapped = [fitted_lines(caption, width - 4, measure) for caption in captions]
    line_h = 12
    text_h = line_h * max((len(lines) for lines in wrapped), default=1) + 2
    canvas = Image.new("RGB", (columns * width, rows * (cell + text_h)), "white")
    draw = ImageDraw.Draw(canvas)
    pixels = to_uint8(images)
    for i, (array, lines) in enumerate(zip(pixels, wrapped)):
        x, y = (i % columns) * width, (i // columns) * (cell + text_h)
        canvas.paste(Image.fromarray(np.ascontiguousarray(array)).resize((width, cell), Image.NEAREST), (x, y))
        for k, text in enumerate(lines):
            draw.text((x + 2, y + cell + 1 + line_h * k), text, fill="black")
    return canvas


class SampleGrid(Callback):
    """Every ``every_n_steps`` training batches, save the first ``num_images`` samples as
    ``<log_dir>/samples/step_<k>.png`` (and, for videos, ``step_<k>.<video_format>``) and log the PNG to
    TensorBoard when that logger is in use.

    Args:
        frames: the frames of a video shown in its strip. video_format: ``gif``, ``mp4`` or None. fps: its speed.
    """

    def __init__(self, every_n_steps: int = 10, num_images: int = 16, columns: int = 4,
                 frames: FrameSpec = DEFAULT_FRAMES, video_format: Optional[str] = "gif", fps: int = 8):
        if every_n_steps < 1 or num_images < 1:
            raise ValueError("SampleGrid: every_n_steps and num_images must be >= 1")
        problems = [p for p in (frames_problem(frames), video_format and animation_problem(video_format)) if p]
        if fps < 1:
            problems.append(f"fps={fps} must be >= 1")
        if problems:
            raise ValueError("SampleGrid: " + "; ".join(problems))
        self.every_n_steps, self.num_images, self.columns = every_n_steps, num_images, columns
        self.frames, self.video_format, self.fps = frames, video_format, fps
        self.dir: Optional[Path] = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.fit_loop.total_batch_idx
        if not outputs or step % self.every_n_steps:
            return
        # Trainer.log_dir broadcasts from rank zero: every rank asks, or rank zero waits forever (a DDP hang)
        self.dir = Path(trainer.log_dir or trainer.default_root_dir) / "samples"
        if not trainer.is_global_zero:
            return
        n = min(self.num_images, len(outputs["prompts"]))
        captions = [f"{p}\nr={r:.3f}" for p, r in zip(outputs["prompts"][:n], outputs["rewards"][:n].tolist())]
        samples = outputs["images"][:n]
        image = grid_image(as_stills(samples, self.frames), captions, self.columns)
        self.dir.mkdir(parents=True, exist_ok=True)
        image.save(self.dir / f"step_{step:06d}.png")
        if samples.ndim == 5 and self.video_format:  # the grid, frame by frame
            grids = [np.asarray(grid_image(samples[:, t], captions, self.columns)) for t in range(samples.shape[1])]
            write_animation(grids, self.dir / f"step_{step:06d}.{self.video_format}", self.fps)
        experiment = getattr(trainer.logger, "experiment", None)
        if hasattr(experiment, "add_image"):
            experiment.add_image("samples", np.asarray(image), trainer.global_step, dataformats="HWC")
