"""How one PPO epoch splits the trained (sample, step) pairs into minibatches (one optimizer step each) and
micro-batches (one forward/backward each), over every rank at once.

The shuffle runs on the pairs of the batch gathered from every rank, with a generator every rank seeds alike, so
minibatch ``m`` holds the same pairs whatever the number of processes; each rank then trains its own rows of it.
Ranks therefore take the same number of optimizer steps (``min(num_minibatches, pairs)``, the same everywhere)
even when their pair counts differ, and a 2-process run trains exactly the minibatches of a 1-process run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Minibatch:
    """One optimizer step's share of a rank: ``size`` pairs over every rank (the mean's denominator) and this
    rank's ``micro`` batches of (local row, step) pairs ``[P_i, 2]`` (empty when it holds none of them); under FSDP,
    ``padding`` more micro-batches of weight 0 so that every rank runs as many forward passes (each a collective)."""

    size: int
    micro: list[Tensor]
    padding: int = 0


def shuffled_minibatches(pairs: Tensor, gen: torch.Generator, num_minibatches: int,
                         whole_samples: bool = False) -> list[Tensor]:
    """One epoch's minibatches of ``pairs [P, 2]`` (row, step), shuffled: by pair, or by whole sample (every trained
    step of a row in one minibatch, contiguous, for sequence-level losses such as ``gspo``).

    >>> pairs = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]])
    >>> [len(m) for m in shuffled_minibatches(pairs, torch.Generator(), 2)]
    [3, 3]
    >>> whole = shuffled_minibatches(pairs, torch.Generator().manual_seed(0), 3, whole_samples=True)
    >>> sorted(m[:, 0].tolist() for m in whole)  # each minibatch one whole sample
    [[0, 0], [1, 1], [2, 2]]
    """
    if not whole_samples:
        return list(pairs[torch.randperm(len(pairs), generator=gen).to(pairs.device)].chunk(num_minibatches))
    samples = pairs[:, 0].unique()
    order = samples[torch.randperm(len(samples), generator=gen).to(samples.device)]
    return [torch.cat([pairs[pairs[:, 0] == s] for s in group.tolist()]) for group in order.chunk(num_minibatches)]


def split_micro(minibatch: Tensor, micro_batch_size: int, whole_samples: bool = False) -> list[Tensor]:
    """Micro-batches of at most ``micro_batch_size`` pairs, in order; ``whole_samples`` packs consecutive whole rows
    (a row with more pairs than the size gets a micro-batch of its own).

    >>> [len(m) for m in split_micro(torch.tensor([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]]), 2, whole_samples=True)]
    [2, 1, 2]
    """
    if not whole_samples:
        return list(minibatch.split(micro_batch_size))
    micro, current, size = [], [], 0
    for rows in minibatch[:, 0].unique_consecutive(return_counts=True)[1].tolist():
        block, minibatch = minibatch[:rows], minibatch[rows:]
        if current and size + rows > micro_batch_size:
            micro.append(torch.cat(current))
            current, size = [], 0
        current.append(block)
        size += rows
    return micro + [torch.cat(current)] if current else micro


def rank_minibatches(pairs: Tensor, gen: torch.Generator, num_minibatches: int, micro_batch_size: int,
                     whole_samples: bool = False, rows: tuple[int, int] = (0, -1)) -> list[Minibatch]:
    """One epoch for the rank owning global rows ``[rows[0], rows[1])`` of the gathered ``pairs [P, 2]`` (-1: to
    the end), with local row indices.

    >>> pairs = torch.tensor([[0, 0], [1, 0], [2, 0], [3, 0]])
    >>> mb = rank_minibatches(pairs, torch.Generator().manual_seed(0), 1, 8, rows=(2, 4))[0]
    >>> mb.size, sorted(mb.micro[0][:, 0].tolist())
    (4, [0, 1])
    """
    low, high = rows
    out = []
    for minibatch in shuffled_minibatches(pairs, gen, num_minibatches, whole_samples):
        mine = minibatch[(minibatch[:, 0] >= low) & ((minibatch[:, 0] < high) if high >= 0 else True)]
        local = mine - torch.tensor([low, 0], device=mine.device) if low else mine
        out.append(Minibatch(len(minibatch), split_micro(local, micro_batch_size, whole_samples) if len(local) else []))
    return out


def micro_batches(pairs: Tensor, gen: torch.Generator, num_minibatches: int, micro_batch_size: int,
                  whole_samples: bool = False) -> list[list[Tensor]]:
    """One epoch on one rank: ``num_minibatches`` lists of micro-batches of (sample, step) pairs ``[P, 2]``.

    >>> pairs = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]])
    >>> [[len(m) for m in minibatch] for minibatch in micro_batches(pairs, torch.Generator(), 2, 2)]
    [[2, 1], [2, 1]]
    >>> packed = micro_batches(pairs, torch.Generator().manual_seed(0), 1, 3, whole_samples=True)
    >>> sorted(sorted(set(m[:, 0].tolist())) for m in packed[0])  # 2 pairs per sample: one sample per micro-batch
    [[0], [1], [2]]
    """
    return [mb.micro for mb in rank_minibatches(pairs, gen, num_minibatches, micro_batch_size, whole_samples)]
