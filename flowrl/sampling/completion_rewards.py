"""Rewards of clean latents (ODE completions and final samples): decode and score in chunks of a memory budget.

DenseGRPO and TP-GRPO build a reward matrix ``R[b, k]``: the reward of the ODE completion of the latent before
step ``k``, and in the last column the reward of the trajectory's own final image. Decoding (a VAE on real models)
and reward models are the memory-heavy part, so at most ``chunk_size`` images are decoded and scored at once.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

#: ``score(images [n, 3, H, W] in [0, 1], prompts [n], rows [n]) -> [n]``: the (weighted) total reward of each image;
#: ``rows`` are the trajectories the images belong to (what picks each image's per-row reward metadata, such as an
#: edit's source images).
ScoreFn = Callable[[Tensor, list[str], Tensor], Tensor]
#: ``decode(latents [n, *shape], rows [n]) -> images [n, 3, H, W]`` (videos ``[n, F, 3, H, W]``): ``rows`` are the
#: trajectories the latents belong to (what picks each one's conditioning where decoding reads it: LTX-2
#: image-to-video's first frame)
DecodeFn = Callable[[Tensor, Tensor], Tensor]


@torch.no_grad()
def completion_rewards(decode: DecodeFn, latents: Tensor, prompts: Sequence[str],
                       score: ScoreFn, chunk_size: Optional[int] = None) -> Tensor:
    """Rewards ``[B, K]`` of clean latents ``[B, K, *shape]``, decoded and scored ``chunk_size`` images at a time.

    Args:
        decode: see :data:`DecodeFn` (its ``rows`` index ``prompts``).
        latents: ``[B, K, *shape]``, e.g. the completions of steps ``0..T-1`` followed by the final latent, which
            gives ``R[b, k]`` for ``k = 0..T``.
        prompts: ``[B]``, the prompt of each trajectory (shared by its ``K`` images).
        score: see :data:`ScoreFn` (its ``rows`` index ``prompts``). chunk_size: images per decode + score call;
            None: all ``B * K`` at once.
    Returns:
        ``[B, K]`` float32 (non-finite scores are kept: the caller decides what an invalid reward means).

    >>> latents = torch.arange(6.0).reshape(2, 3, 1)
    >>> completion_rewards(lambda z, rows: z, latents, ["a", "b"], lambda im, p, rows: im[:, 0] + 10 * rows,
    ...                    chunk_size=4)
    tensor([[ 0.,  1.,  2.],
            [13., 14., 15.]])
    """
    batch, per_row = latents.shape[:2]
    if len(prompts) != batch:
        raise ValueError(f"one prompt per trajectory: latents have B={batch} rows, got {len(prompts)} prompts")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1 (or None: everything at once)")
    flat = latents.reshape(batch * per_row, *latents.shape[2:])
    flat_prompts = [p for p in prompts for _ in range(per_row)]
    rows = torch.arange(batch).repeat_interleave(per_row)  # [B * K] the trajectory of each image
    size = chunk_size or max(len(flat), 1)
    scores = [score(decode(flat[i:i + size], rows[i:i + size]), flat_prompts[i:i + size], rows[i:i + size])
              .float().reshape(-1)
              for i in range(0, len(flat), size)]
    return torch.cat(scores).reshape(batch, per_row)
