"""A grid of training samples with their prompts and rewards, written every N steps (PNG + TensorBoard)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
from lightning.pytorch import Callback
from PIL import Image, ImageDraw
from torch import Tensor


def grid_image(images: Tensor, captions: list[str], columns: int = 4, cell: int = 96) -> Image.Image:
    """Images ``[N, 3, H, W]`` in ``[0, 1]`` as one PIL grid, each upscaled (nearest) to ``cell`` px wide with
    its caption underneath."""
    rows = -(-len(captions) // columns)
    text_h = 26
    canvas = Image.new("RGB", (columns * cell, rows * (cell + text_h)), "white")
    draw = ImageDraw.Draw(canvas)
    pixels = (images.detach().float().clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
    for i, (array, caption) in enumerate(zip(pixels, captions)):
        x, y = (i % columns) * cell, (i // columns) * (cell + text_h)
        canvas.paste(Image.fromarray(np.ascontiguousarray(array)).resize((cell, cell), Image.NEAREST), (x, y))
        for line, text in enumerate(caption.split("\n")[:2]):
            draw.text((x + 2, y + cell + 1 + 12 * line), text[:18], fill="black")
    return canvas


class SampleGrid(Callback):
    """Every ``every_n_steps`` training batches, save the first ``num_images`` samples as
    ``<log_dir>/samples/step_<k>.png`` and log them to TensorBoard when that logger is in use."""

    def __init__(self, every_n_steps: int = 10, num_images: int = 16, columns: int = 4):
        if every_n_steps < 1 or num_images < 1:
            raise ValueError("SampleGrid: every_n_steps and num_images must be >= 1")
        self.every_n_steps, self.num_images, self.columns = every_n_steps, num_images, columns
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
        image = grid_image(outputs["images"][:n], captions, self.columns)
        self.dir.mkdir(parents=True, exist_ok=True)
        image.save(self.dir / f"step_{step:06d}.png")
        experiment = getattr(trainer.logger, "experiment", None)
        if hasattr(experiment, "add_image"):
            experiment.add_image("samples", np.asarray(image), trainer.global_step, dataformats="HWC")
