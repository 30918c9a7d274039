"""How one PPO epoch splits the trained (sample, step) pairs into minibatches (one optimizer step each) and
micro-batches (one forward/backward each)."""

from __future__ import annotations

import torch
from torch import Tensor


def micro_batches(pairs: Tensor, gen: torch.Generator, num_minibatches: int, micro_batch_size: int,
                  whole_samples: bool = False) -> list[list[Tensor]]:
    """One epoch, shuffled: ``num_minibatches`` lists of micro-batches of (sample, step) pairs ``[P, 2]``.

    Per-position losses shuffle the pairs themselves. A sequence-level loss (``whole_samples``, e.g. ``gspo``) needs
    every trained step of a sample in one micro-batch: samples are shuffled and packed whole, up to
    ``micro_batch_size`` pairs (a sample with more trained steps than that gets a micro-batch of its own).

    >>> pairs = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]])
    >>> [[len(m) for m in minibatch] for minibatch in micro_batches(pairs, torch.Generator(), 2, 2)]
    [[2, 1], [2, 1]]
    >>> packed = micro_batches(pairs, torch.Generator().manual_seed(0), 1, 3, whole_samples=True)
    >>> sorted(sorted(set(m[:, 0].tolist())) for m in packed[0])  # 2 pairs per sample: one sample per micro-batch
    [[0], [1], [2]]
    """
    if not whole_samples:
        shuffled = pairs[torch.randperm(len(pairs), generator=gen).to(pairs.device)]
        return [list(minibatch.split(micro_batch_size)) for minibatch in shuffled.chunk(num_minibatches)]
    samples = pairs[:, 0].unique()
    order = samples[torch.randperm(len(samples), generator=gen).to(samples.device)]
    out = []
    for group in order.chunk(num_minibatches):
        micro, current = [], []
        for sample_index in group.tolist():
            rows = pairs[pairs[:, 0] == sample_index]
            if current and sum(map(len, current)) + len(rows) > micro_batch_size:
                micro.append(torch.cat(current))
                current = []
            current.append(rows)
        out.append(micro + [torch.cat(current)] if current else micro)
    return out
