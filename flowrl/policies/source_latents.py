"""An edit's source images as the transformer reads them: packed latent tokens appended to the noisy image's tokens
at every evaluation (Qwen-Image-Edit, FLUX.1 Kontext).

A prompt record's source images are encoded once (an LRU cache keyed by their 8-bit pixels) and stored per row in
``Conditioning.shared``, so a group, its tree and both sides of classifier-free guidance share them:
``shared["source"] [B, N, D]`` (the rows' packed tokens, zero-padded to the longest row) and
``shared["source_grid"] [B, K, 2]`` (each source image's token grid ``(h, w)``; ``(0, 0)`` pads a row with fewer
images). Sources of other sizes give other token counts and positions, which one transformer batch cannot mix (its
RoPE reads one image layout for every row): :func:`grid_groups` splits a batch into the rows that share a layout,
each run as one batch, padding never reaching the transformer.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from flowrl.policies.pipeline_policy import PromptCache

SOURCE, SOURCE_GRID = "source", "source_grid"


def image_key(image: Tensor) -> str:
    """A key for an image's 8-bit pixels (what a pipeline reads from a PIL image), shape included.

    >>> image_key(torch.zeros(3, 2, 2)) == image_key(torch.full((3, 2, 2), 0.001)), image_key(torch.zeros(3, 1, 4))[:9]
    (True, '(3, 1, 4)')
    """
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    return f"{tuple(pixels.shape)}:{hashlib.sha1(pixels.numpy().tobytes()).hexdigest()}"


def first_frame_encodings(images: list[list[Tensor]], cache: PromptCache, encode: Callable[[Tensor], tuple],
                          name: str) -> list[tuple]:
    """Each row's encoding of its one conditioning image (an image-to-video policy's first frame), each distinct image
    encoded once by ``encode`` and cached in ``cache``.

    Raises:
        ValueError: a row with other than one image (``name``: the policy's class, for the message).
    """
    counts = sorted({len(row) for row in images})
    if counts != [1]:
        raise ValueError(f"{name} takes exactly 1 conditioning image (the first frame) per prompt; got {counts} per "
                         "prompt: give each prompt record one image in its \"images\" list")
    keys = [image_key(row[0]) for row in images]
    frames = dict([(key, row[0]) for key, row in zip(keys, images)][::-1])  # a key's first frame
    found = cache.lookup(keys, lambda missing: [encode(frames[key]) for key in missing])
    return [found[key] for key in keys]


def row_key(images: Sequence[Tensor]) -> str:
    """The key of one prompt record's images, in order."""
    return "|".join(image_key(image) for image in images)


def count_problem(images: Optional[list[list[Tensor]]], allowed: int, policy: str) -> Optional[str]:
    """Why the per-row image counts do not fit a policy taking ``allowed`` images per prompt (-1: at least one).

    >>> count_problem([[torch.zeros(3, 2, 2)]] * 2, 1, "FluxKontextPolicy") is None
    True
    >>> count_problem([[], [torch.zeros(3, 2, 2)]], -1, "QwenImageEditPolicy")
    'QwenImageEditPolicy takes at least 1 source image per prompt; got [0, 1] per prompt'
    """
    counts = sorted({len(row) for row in images or []})
    wrong = [c for c in counts if (c < 1 if allowed < 0 else c != allowed)]
    if not wrong:
        return None
    need = "at least 1 source image" if allowed < 0 else f"exactly {allowed} source image{'s' * (allowed > 1)}"
    return f"{policy} takes {need} per prompt; got {counts} per prompt"


def stack_sources(rows: Sequence[tuple[Tensor, Tensor]], device: torch.device) -> dict[str, Tensor]:
    """``{source: [B, N, D], source_grid: [B, K, 2]}`` from each row's ``(tokens [n_i, D], grid [k_i, 2])``.

    >>> out = stack_sources([(torch.ones(2, 1), torch.tensor([[1, 2]])), (torch.ones(4, 1), torch.tensor([[2, 1],
    ...                      [1, 2]]))], torch.device("cpu"))
    >>> out["source"].sum(dim=(1, 2)).tolist(), out["source_grid"].tolist()
    ([2.0, 4.0], [[[1, 2], [0, 0]], [[2, 1], [1, 2]]])
    """
    tokens = max(len(t) for t, _ in rows)
    images = max(len(g) for _, g in rows)
    source = rows[0][0].new_zeros(len(rows), tokens, rows[0][0].shape[-1])
    grid = torch.zeros(len(rows), images, 2, dtype=torch.long)
    for i, (t, g) in enumerate(rows):
        source[i, :len(t)], grid[i, :len(g)] = t, g
    return {SOURCE: source.to(device), SOURCE_GRID: grid.to(device)}


def grid_groups(grid: Tensor) -> list[tuple[Tensor, list[tuple[int, int]]]]:
    """The rows of ``grid [B, K, 2]`` that share a source layout, in order of first appearance, with that layout
    (padding ``(0, 0)`` dropped).

    >>> [(rows.tolist(), layout) for rows, layout in grid_groups(torch.tensor([[[2, 2]], [[1, 4]], [[2, 2]]]))]
    [([0, 2], [(2, 2)]), ([1], [(1, 4)])]
    """
    layouts: dict[tuple, list[int]] = {}
    for i, row in enumerate(grid.tolist()):
        layouts.setdefault(tuple(tuple(g) for g in row if g != [0, 0]), []).append(i)
    return [(torch.tensor(rows, device=grid.device), list(layout)) for layout, rows in layouts.items()]


def by_layout(size: int, grid: Tensor, run: Callable[[Tensor, list[tuple[int, int]]], Tensor],
              sharded: bool = False) -> Tensor:
    """``run(rows, layout)`` for each group of the ``size`` rows sharing a source layout, put back in row order (one
    call, and no copy, when the batch has one layout). ``run`` returns the output ``[len(rows), ...]`` of its rows.

    >>> by_layout(3, torch.tensor([[[2, 2]], [[1, 4]], [[2, 2]]]), lambda rows, layout: rows[:, None] * 10.0).tolist()
    [[0.0], [10.0], [20.0]]

    Raises:
        ValueError: ``sharded`` (an FSDP2 denoiser, whose every call is a collective) and more than one layout: the
            ranks would call it different numbers of times.
    """
    groups = grid_groups(grid)
    if sharded and len(groups) > 1:
        raise ValueError(f"under FSDP2 every transformer call is a collective, and this batch's source images have "
                         f"{len(groups)} token layouts (one call each), which other ranks may not have; give the "
                         "records' sources one aspect ratio (the policy resizes them to source_area), or train "
                         "with --trainer.strategy=ddp")
    if len(groups) == 1:
        return run(groups[0][0], groups[0][1])
    out = None
    for rows, layout in groups:
        part = run(rows, layout)
        if out is None:
            out = part.new_zeros(size, *part.shape[1:])
        out = out.index_copy(0, rows, part)  # out of place: autograd sees every group's part
    return out


class SourceCache:
    """Least-recently-used cache of each prompt record's encoded sources ``(tokens [N, D], grid [K, 2])``."""

    def __init__(self, size: int):
        self.cache = PromptCache(size)

    def rows(self, images: list[list[Tensor]], encode: Callable[[list[Tensor]], tuple[Tensor, Tensor]],
             device: torch.device) -> dict[str, Tensor]:
        """The stacked sources of ``images`` (one list per row), each distinct record encoded once."""
        keys = [row_key(row) for row in images]
        rows = dict([*zip(keys, images)][::-1])  # a key's first row, as encoded before the cache knew it
        found = self.cache.lookup(keys, lambda missing: [encode(rows[key]) for key in missing])
        return stack_sources([found[key] for key in keys], device)
