"""What one transformer block saves for its backward during a whole model call: the bytes behind the activation
memory scripts (``qwen21_activation_memory.py``, ``hunyuan15_activation_memory.py``, ``ltx2_activation_memory.py``),
counted exactly on any device with ``saved_tensors_hooks`` (a CPU has no allocator peak counter)."""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn


def block_saved_bytes(model: nn.Module, block: nn.Module, call: Callable[[], object]) -> int:
    """Bytes of the distinct storages ``block`` saves for the backward while ``call()`` runs ``model``, its weights
    excluded (a matmul saves its weight too, which is not activation memory).

    >>> lin = nn.Linear(3, 3, bias=False)
    >>> block_saved_bytes(lin, lin, lambda: lin(torch.ones(4, 3, requires_grad=True)))  # the input: 4 x 3 x 4 bytes
    48
    """
    storages: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor):
        if t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    forward = block.forward

    def counted(*args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return forward(*args, **kwargs)

    block.forward = counted
    try:
        call()
    finally:
        block.forward = forward
    return sum(storages.values())


def one_block_model(cls: type[nn.Module]) -> tuple[nn.Module, int]:
    """``cls`` with one block at its published width (seeded random weights, frozen) and the published model's number
    of blocks (its ``num_layers`` default): what the activation-memory scripts measure and multiply by."""
    torch.manual_seed(0)
    return cls(num_layers=1).requires_grad_(False), inspect.signature(cls.__init__).parameters["num_layers"].default
