"""Writes what ``predict`` generates: one PNG per (prompt, seed), a grid with one prompt per row and one seed per
column, ``scores.csv`` with every reward callback's score, and a summary on the console naming the folder. A video
is written as a PNG strip of its frames (first, middle, last) and an animation beside it (``video_format``: ``gif``,
or ``mp4`` with ``flowrl[video]``), named in the ``video`` column of ``scores.csv``.

A Lightning :class:`~lightning.pytorch.callbacks.BasePredictionWriter`; the flowrl CLI adds one to every ``predict``
that has none. Without ``output_dir`` the images go to ``<run>/predictions/<n>`` beside the checkpoint's
``checkpoints/`` folder (or ``<default_root_dir>/predictions/<n>`` without a checkpoint), ``n`` the first free number.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from PIL import Image

from flowrl.callbacks.sample_grid import grid_image
from flowrl.callbacks.video_samples import animation_problem, as_stills, to_uint8, write_animation
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec, frames_problem

FIXED = ("row", "prompt", "seed", "file", "video")  # the columns of scores.csv before the rewards'


def next_free_folder(parent: Path) -> Path:
    """Creates and returns ``parent/<n>`` for the smallest ``n >= 0`` not taken (an atomic ``mkdir``, so two runs
    never share one)."""
    parent.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        try:
            (parent / str(n)).mkdir()
            return parent / str(n)
        except FileExistsError:
            n += 1


def image_name(row: int, prompt: str, seed: int) -> str:
    """``<row>_<prompt as a slug>_seed<seed>.png``.

    >>> image_name(3, "red 3 and blue 7!", 12)
    '0003_red-3-and-blue-7_seed12.png'
    """
    slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:60] or "prompt"
    return f"{row:04d}_{slug}_seed{seed}.png"


class ImageWriter(BasePredictionWriter):
    """Args:
        output_dir: the folder for the images (made if missing); None: a new numbered folder, see the module doc.
        columns: images per row of the grid (None: the number of seeds, so each row is one prompt).
        cell: the grid's cell width in pixels (each image is resized to it).
        max_grid_images: the grid shows the first this many images (every PNG is written regardless).
        frames: the frames of a video in its PNG strip. video_format: its animation, ``gif``, ``mp4`` or None.
        fps: the animation's speed.
    """

    def __init__(self, output_dir: Optional[str] = None, columns: Optional[int] = None, cell: int = 128,
                 max_grid_images: int = 64, frames: FrameSpec = DEFAULT_FRAMES, video_format: Optional[str] = "gif",
                 fps: int = 8):
        super().__init__(write_interval="batch")
        if cell < 8 or max_grid_images < 1 or (columns is not None and columns < 1):
            raise ValueError("ImageWriter: cell must be >= 8, max_grid_images and columns >= 1")
        if problem := frames_problem(frames) or (video_format and animation_problem(video_format)):
            raise ValueError(f"ImageWriter: {problem}")
        self.frames, self.video_format, self.fps = frames, video_format, max(1, fps)
        self.output_dir = output_dir
        self.columns, self.cell, self.max_grid_images = columns, cell, max_grid_images
        self.folder: Optional[Path] = None
        self.records: list[dict[str, Any]] = []
        self._thumbs: list[torch.Tensor] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "predict" and trainer.world_size > 1:
            raise ValueError(f"predict writes one folder from one process, but the trainer has {trainer.world_size}; "
                             "run it with --trainer.devices=1 (and --trainer.num_nodes=1)")

    def on_predict_start(self, trainer, pl_module) -> None:
        self.records, self._thumbs = [], []
        if self.output_dir is not None:
            self.folder = Path(self.output_dir).expanduser()
            self.folder.mkdir(parents=True, exist_ok=True)
            return
        ckpt = Path(trainer.ckpt_path) if trainer.ckpt_path else None
        run = ckpt.parent.parent if ckpt is not None and ckpt.parent.name == "checkpoints" else (
            ckpt.parent if ckpt is not None else Path(trainer.default_root_dir))
        self.folder = next_free_folder(run / "predictions")

    def write_on_batch_end(self, trainer, pl_module, prediction: dict, batch_indices, batch, batch_idx: int,
                           dataloader_idx: int = 0) -> None:
        images = prediction["images"]  # [B, 3, H, W], or videos [B, F, 3, H, W]
        pixels = to_uint8(as_stills(images, self.frames))  # [B, H, W, 3]: a video's frame strip
        for i, (prompt, seed, row) in enumerate(zip(prediction["prompts"], prediction["seeds"].tolist(),
                                                    prediction["rows"].tolist())):
            name = image_name(row, prompt, seed)
            array = np.ascontiguousarray(pixels[i])
            Image.fromarray(array).save(self.folder / name)
            record = {"row": row, "prompt": prompt, "seed": seed, "file": name}
            if images.ndim == 5 and self.video_format:
                record["video"] = Path(name).with_suffix(f".{self.video_format}").name
                write_animation(list(to_uint8(images[i])), self.folder / record["video"], self.fps)
            scores = {k: float(v[i]) for k, v in prediction["rewards"].items()}
            self.records.append({**record, **scores})
            if len(self._thumbs) < self.max_grid_images:
                self._thumbs.append(self.thumbnail(array))

    def thumbnail(self, array: np.ndarray) -> torch.Tensor:
        """An image ``[H, W, 3]`` uint8 resized to the grid's cell height, as ``[3, cell, cell * W / H]`` in [0, 1]."""
        image = Image.fromarray(array)
        kind = Image.NEAREST if image.height <= self.cell else Image.BICUBIC  # keep tiny pixels sharp
        width = max(1, round(self.cell * image.width / image.height))
        small = np.asarray(image.resize((width, self.cell), kind))
        return torch.from_numpy(small.copy()).permute(2, 0, 1).float() / 255

    def on_predict_end(self, trainer, pl_module) -> None:
        if not self.records:
            return
        names = [k for k in self.records[0] if k not in FIXED]
        with open(self.folder / "scores.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[k for k in FIXED if k in self.records[0]] + names)
            writer.writeheader()
            writer.writerows(self.records)
        seeds = getattr(trainer.datamodule, "predict_seeds", None)
        columns = self.columns or (len(seeds) if seeds else 4)
        captions = [f"{r['prompt']}\nseed {r['seed']}" + "".join(f" r={r[k]:.3f}" for k in names[:1])
                    for r in self.records[:len(self._thumbs)]]
        grid_image(torch.stack(self._thumbs), captions, columns, self.cell).save(self.folder / "grid.png")
        print("\n".join(self.summary(pl_module, names)), flush=True)

    def summary(self, pl_module, names: list[str]) -> list[str]:
        prompts = len({r["prompt"] for r in self.records})
        how = ", ".join(f"{label} {value:g}" for label, value in (
            ("ODE steps", getattr(pl_module, "eval_num_steps", None)),
            ("guidance", getattr(pl_module, "guidance_scale", None))) if value is not None)
        plural = "s" if prompts > 1 else ""
        kind = "videos" if "video" in self.records[0] else "images"
        lines = [f"flowrl predict: {len(self.records)} {kind} of {prompts} prompt{plural} ({how}) -> {self.folder}",
                 f"  grid:    {self.folder / 'grid.png'}", f"  scores:  {self.folder / 'scores.csv'}"]
        for name in names:
            values = [r[name] for r in self.records if math.isfinite(r[name])]
            mean = f"{sum(values) / len(values):.4f}" if values else "nan"
            left_out = len(self.records) - len(values)
            lines.append(f"  {name}: mean {mean} over {len(values)} {kind}"
                         + (f" ({left_out} non-finite left out)" if left_out else ""))
        return lines
