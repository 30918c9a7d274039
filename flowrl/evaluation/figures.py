"""The report's two pictures: the paired differences with their intervals (matplotlib), and image grids in which
each row is one (prompt, seed), so one initial noise, drawn by every model side by side, with scores under each
image (PIL)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from flowrl.callbacks.sample_grid import fitted_lines

#: one colour per tuned model, in order (matplotlib's default cycle, without the base's grey)
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def difference_chart(panels: list[tuple[str, dict]], out: Path) -> Path:
    """Horizontal bars of paired differences with their intervals, one panel per metric (each has its own scale).

    Args:
        panels: ``(title, {model: (difference, low, high)})`` per metric, in display order.
        out: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here, and none needed
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(m for _, bars in panels for m in bars))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 0.5 + (0.35 * len(models) + 0.55) * len(panels)),
                             squeeze=False)
    for ax, (title, bars) in zip(axes[:, 0], panels):
        names = [m for m in models if m in bars]
        y = np.arange(len(names))[::-1]
        values = np.array([bars[m] for m in names], dtype=float).reshape(-1, 3)  # [M, (difference, low, high)]
        errors = np.abs(values[:, 1:].T - values[:, 0])  # [2, M], distances to the interval's ends
        ax.barh(y, values[:, 0], xerr=errors, color=[COLOURS[models.index(m) % len(COLOURS)] for m in names],
                height=0.6, capsize=3, error_kw={"elinewidth": 1})
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y, names, fontsize=8)
        ax.set_title(title, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=8)
        low, high = np.nanmin(values[:, 1:]), np.nanmax(values[:, 1:])
        pad = 0.1 * max(high - low, abs(high), abs(low), 1e-12)
        ax.set_xlim(min(low, 0) - pad, max(high, 0) + pad)  # zero always in view: the reader's reference
    axes[-1, 0].set_xlabel("tuned minus base, mean over prompts (bars: 95% bootstrap interval over prompts)",
                           fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _fit(image: np.ndarray, cell: int) -> Image.Image:
    """An ``[H, W, 3]`` uint8 image at ``cell`` px: small ones enlarged without blur (a 16 px canvas stays crisp)."""
    picture = Image.fromarray(image)
    return picture.resize((cell, cell), Image.NEAREST if picture.width <= cell else Image.BICUBIC)


def paired_grid(rows: list[tuple[str, list[list[np.ndarray]], list[list[list[str]]]]], seeds: list[int],
                models: list[str], out: Path, cell: int = 112, label_width: int = 150) -> Path:
    """One row per prompt; in it, for each seed (one initial noise), every model's image side by side, with the
    scores under each image. Labels and captions are wrapped to their width whole, as the sample grid's
    (:func:`flowrl.callbacks.sample_grid.fitted_lines`), each caption from a line of its own.

    Args:
        rows: ``(prompt label, images [seed][model] as [H, W, 3] uint8, captions [seed][model])``.
        seeds: the seeds of the column groups. models: the models of each group (the base first).
        cell: each image's size in px. label_width: the width of the prompt labels.
    """
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength
    line, gap, group_gap = 12, 6, 18
    rows = [(label, images, [[[text for caption in captions for text in fitted_lines(caption, cell - 4, measure)]
                              for captions in per_model] for per_model in per_seed])
            for label, images, per_seed in rows]
    captions = max((len(c) for _, _, per_seed in rows for lines in per_seed for c in lines), default=0)
    row_height = cell + 8 + line * captions
    labels = [fitted_lines(label, label_width - 8, measure, max_lines=max(1, (row_height - 8) // line))
              for label, _, _ in rows]
    header = 3 * line
    group = len(models) * (cell + gap) + group_gap
    canvas = Image.new("RGB", (label_width + len(seeds) * group, header + len(rows) * row_height), "white")
    draw = ImageDraw.Draw(canvas)
    for g, seed in enumerate(seeds):
        x0 = label_width + g * group
        draw.text((x0 + 2, 2), f"seed {seed}: the same noise for every model", fill="black", font=font)
        for j, model in enumerate(models):
            draw.text((x0 + j * (cell + gap) + 2, 2 + line + 2), model, fill="black", font=font)
    for i, ((_, images, lines), label) in enumerate(zip(rows, labels)):
        y = header + i * row_height
        for k, text in enumerate(label):
            draw.text((4, y + 4 + k * line), text, fill="black", font=font)
        for g, (per_model, per_caption) in enumerate(zip(images, lines)):
            for j, (image, caption) in enumerate(zip(per_model, per_caption)):
                x = label_width + g * group + j * (cell + gap)
                canvas.paste(_fit(image, cell), (x, y))
                for k, text in enumerate(caption):
                    draw.text((x + 2, y + cell + 2 + k * line), text, fill="black", font=font)
    canvas.save(out)
    return out
