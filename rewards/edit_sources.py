"""What an edit reward reads besides the edited image: each row's source images and its instruction.

The edit reward signature (every reward callback's ``score(images, prompts, metadata)``, read for editing):

- ``images [B, 3, H, W]`` in ``[0, 1]``: the edited images (outputs);
- ``prompts [B]``: the edit instructions, each row's prompt record's ``prompt``;
- ``metadata["images"]``: ``B`` lists, each the row's prompt record's source images in file order, ``[3, h, w]``
  float tensors in ``[0, 1]`` of their own sizes (not resized to the output's). Rows of one prompt record (a group,
  a tree's leaves, ODE completions) see the same list. ``metadata`` also holds ``group_ids`` and ``seeds``.

Rewards that ignore ``metadata`` (PickScore, CLIPScore, ...) score edits as images, unchanged. A reward that needs the
sources and is given a batch without them raises :func:`sources`' error, which names the fix.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def sources(metadata: dict[str, Any], batch: int, reward: str) -> list[list[Tensor]]:
    """``metadata["images"]``: each row's source images (see the module docstring).

    Raises:
        ValueError: the batch carries no source images, or not one list per row.
    """
    images = metadata.get("images")
    if images is None:
        raise ValueError(f"reward {reward!r} compares each output with its prompt record's source images, but the "
                         "batch has none: train an editing policy (QwenImageEditPolicy, FluxKontextPolicy) on prompt "
                         "records with \"images\" (a .jsonl file; see docs/editing.md)")
    if len(images) != batch:
        raise ValueError(f"reward {reward!r}: metadata['images'] has {len(images)} rows for {batch} images; it must "
                         "hold one list of source images per row")
    return images


def source_at(metadata: dict[str, Any], batch: int, reward: str, index: int) -> list[Tensor]:
    """Source image ``index`` of each row (``0``: the first, ``-1``: the last).

    Raises:
        ValueError: as :func:`sources`, or a row with no image at ``index``.
    """
    rows = sources(metadata, batch, reward)
    short = sorted({len(row) for row in rows if not -len(row) <= index < len(row)})
    if short:
        raise ValueError(f"reward {reward!r} reads source image {index} of each row, but some rows have {short} "
                         "images; set its source_index to an image every record has (0: the first)")
    return [row[index] for row in rows]


def fitted(image: Tensor, size: tuple[int, int]) -> Tensor:
    """``image [3, h, w]`` resized to ``size`` (bilinear, antialiased): a source stretched to the output's frame.

    >>> fitted(torch.ones(3, 8, 6), (4, 4)).shape
    torch.Size([3, 4, 4])
    """
    return torch.nn.functional.interpolate(image[None].float(), size=size, mode="bilinear", antialias=True,
                                           align_corners=False)[0]
