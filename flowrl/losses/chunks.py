"""Chunk-level policy optimisation (GCPO / Chunk-GRPO, arXiv 2510.21583): GSPO's geometric-mean ratio per chunk of
consecutive denoising steps, and which chunks of a sample are trained.

Notation: B rows, T positions (steps); ``chunks`` the chunk sizes over the first positions (``[2, 3, 4, 7]``: chunk 0
is steps 0-1, chunk 1 steps 2-4, ...); ``c(t)`` the chunk of position t; ``s_c = exp(mean_{t in c} (log_prob_t -
old_log_prob_t))`` the chunk ratio over its valid positions.

Held to ``xingzhejun/GCPO`` ``fastvideo/train_grpo_flux_hpsv3.py`` @ea6cc4d (the ``use_chunk`` branch of
``train_one_step``) and ``fastvideo/utils/chunk.py`` ``set_chunk``: the chunk ratio ``exp(mean new - mean old)``,
PPO clip ``(1 - clip_range, 1 + right_clip_range)`` on it, ``int(num_chunks * timestep_fraction)`` chunks drawn per
sample (a ``randperm`` each, or ``multinomial`` without replacement on the chunks' mean relative-L1 latent change
with ``sample_weight``), each trained chunk's loss divided by the number trained.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from flowrl.losses.policy import _clipped_surrogate, _metrics, register_policy_loss

CHUNK_WEIGHTINGS = ("normalized", "softmax")


def chunk_ids(chunks: Optional[list[int]], num_positions: int) -> Tensor:
    """The chunk of each position ``[T]`` (-1 past the last chunk); ``None`` is one chunk over every position.

    >>> chunk_ids([2, 3], 6).tolist()
    [0, 0, 1, 1, 1, -1]
    """
    if chunks is None:
        return torch.zeros(num_positions, dtype=torch.long)
    if sum(chunks) > num_positions:
        raise ValueError(f"chunks {list(chunks)} cover {sum(chunks)} steps, more than the {num_positions} sampled")
    ids = torch.repeat_interleave(torch.arange(len(chunks)), torch.tensor(chunks, dtype=torch.long))
    return torch.cat([ids, ids.new_full((num_positions - len(ids),), -1)])


@register_policy_loss("chunk_gspo", sequence_level=True)
def chunk_gspo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
               chunks: Optional[list[int]] = None, chunk_mean: bool = True, clip_low: float = 0.2,
               clip_high: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO per chunk: PPO clip on ``s_c``, in GSPO's stop-gradient form ``log s_t = log_prob_t - sg(log_prob_t) +
    sg(log s_c(t))`` (clamped at 10), so position t's gradient is ``-A s_c grad log_prob_t``.

    ``chunk_mean`` (GCPO): each position's loss is scaled by ``n / (n_chunks |c|)`` (``n`` valid positions of the
    row, ``n_chunks`` chunks with a valid position, ``|c|`` valid positions of the chunk), so the mean over the row's
    positions (``token-mean``, the loop's mean over pairs) is the mean over chunks of each chunk's loss and gradient
    ``-A s_c mean_{t in c} grad log_prob_t``: every trained chunk counts once, whatever its length. Off, every position
    carries its chunk's loss (a chunk counts by its length). With one chunk both are :func:`~flowrl.losses.gspo`.

    Args:
        chunks: chunk sizes over the first positions (None: one chunk, GSPO); a valid position past them is an error.
    Raises:
        ValueError: a valid position outside every chunk.

    Chunks [1, 2]: chunk 0 has log r = 0.2, s = e^0.2 = 1.2214; chunk 1 mean(0.1, 0.3) = 0.2 too. With
    ``chunk_mean`` the one-step chunk's position is scaled by 3 / (2 * 1) = 1.5, the others by 3 / (2 * 2) = 0.75:

    >>> loss, _ = chunk_gspo(torch.tensor([[0.2, 0.1, 0.3]]), torch.zeros(1, 3), torch.ones(1, 3),
    ...                      torch.ones(1, 3, dtype=torch.bool), chunks=[1, 2], clip_low=0.5)
    >>> [round(x, 4) for x in loss[0].tolist()]
    [-1.8321, -0.9161, -0.9161]
    """
    ids = chunk_ids(chunks, log_prob.shape[-1]).to(log_prob.device)
    if bool((mask & (ids < 0)).any()):
        past = sorted(set((mask & (ids < 0)).nonzero()[:, 1].tolist()))
        raise ValueError(f"chunk_gspo: trained steps {past} lie past the chunks {list(chunks)}; make the chunks "
                         "cover every trained step")
    n_chunks = int(ids.max()) + 1
    member = (ids[None, :, None] == torch.arange(n_chunks, device=ids.device)) & mask[..., None]  # [B, T, C]
    m = member.to(log_prob.dtype)
    sizes = m.sum(1)  # [B, C] valid positions per chunk
    chunk_log_ratio = torch.einsum("bt,btc->bc", log_prob - old_log_prob, m) / sizes.clamp_min(1)  # [B, C]
    per_position = (m * chunk_log_ratio[:, None, :]).sum(-1)  # [B, T]: log s of the position's chunk
    log_ratio = (log_prob - log_prob.detach() + per_position.detach()).clamp(max=10.0)
    ratio = log_ratio.exp()
    loss, high, low = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    if chunk_mean:
        present = (sizes > 0).sum(-1, keepdim=True)  # [B, 1]
        position_size = (m * sizes[:, None, :]).sum(-1)  # [B, T]
        scale = mask.sum(-1, keepdim=True) / (present * position_size).clamp_min(1)
        loss = loss * scale
    return loss, _metrics(log_prob - old_log_prob, ratio, mask, high, low)


def relative_l1_changes(states: Tensor) -> Tensor:
    """Each step's latent change relative to its input, ``mean|x_{k+1} - x_k| / (mean|x_k| + 1e-8)`` ``[B, T]``
    from the trajectory ``states [B, T + 1, ...]`` (GCPO's ``l1_changes`` with ``sample_weight``).

    >>> relative_l1_changes(torch.tensor([[[2.0], [1.0], [1.5]]])).tolist()
    [[0.5, 0.5]]
    """
    change = (states[:, 1:] - states[:, :-1]).abs().flatten(2).mean(-1)
    return change / (states[:, :-1].abs().flatten(2).mean(-1) + 1e-8)


def draw_chunks(chunks: list[int], num_positions: int, rows: int, fraction: float, generator: torch.Generator,
                step_weights: Optional[Tensor] = None, weighting: str = "normalized") -> Tensor:
    """Which positions are trained ``[rows, T]`` bool: ``int(len(chunks) * fraction)`` chunks per row, drawn
    uniformly without replacement, or (``step_weights [rows, T]`` given) with probabilities from each chunk's mean
    step weight + 1e-8, L1-``normalized`` or ``softmax`` over the row's chunks (GCPO's ``sample_weight_method``).

    >>> mask = draw_chunks([2, 3, 4, 7], 17, rows=3, fraction=0.5, generator=torch.Generator().manual_seed(0))
    >>> mask.shape, mask[:, 16].any().item()  # 2 of the 4 chunks per row; the 17th step is in none
    (torch.Size([3, 17]), False)
    """
    if weighting not in CHUNK_WEIGHTINGS:
        raise ValueError(f"chunk weighting {weighting!r}: choose one of {list(CHUNK_WEIGHTINGS)}")
    ids = chunk_ids(chunks, num_positions)
    n, train = len(chunks), int(len(chunks) * fraction)
    if step_weights is None:
        order = torch.stack([torch.randperm(n, generator=generator) for _ in range(rows)])
    else:
        weights = torch.stack([step_weights[:, ids == c].mean(-1) for c in range(n)], dim=1).double() + 1e-8
        probs = weights / weights.sum(-1, keepdim=True) if weighting == "normalized" else weights.softmax(-1)
        order = torch.multinomial(probs, n, replacement=False, generator=generator)
    drawn = torch.zeros(rows, n, dtype=torch.bool).scatter_(1, order[:, :train], True)
    return (ids >= 0) & drawn[:, ids.clamp_min(0)]
