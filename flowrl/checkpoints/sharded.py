"""Callback state that is sharded (a DTensor, e.g. an EMA of FSDP2-sharded weights) in a sharded checkpoint folder.

Lightning's ``ModelParallelStrategy`` writes the module and optimizer states with ``torch.distributed.checkpoint``
(one file per rank) and everything else into ``meta.pt`` from rank zero, which would keep rank zero's shard of a
callback's DTensor only. Here each such DTensor goes into the distributed save under :data:`SHARDED_KEY` and leaves a
small marker in ``meta.pt`` (plain types, so ``torch.load(weights_only=True)`` reads it); resuming loads every rank's
shard back into the marker's place, and :func:`load_consolidated` rebuilds whole tensors in one process (export).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

#: the top-level key of the callbacks' sharded tensors in the distributed save
SHARDED_KEY = "flowrl_sharded_callbacks"
MARKER = "__flowrl_sharded__"
META = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint


def is_sharded_checkpoint(path: str | Path) -> bool:
    """A checkpoint folder written by a sharded strategy (``meta.pt`` beside the per-rank files)."""
    return Path(path).is_dir() and (Path(path) / META).is_file()


def _walk(state: Any, leaf: Callable[[Any, str], Any], key: str) -> Any:
    if isinstance(state, dict) and MARKER not in state:
        return {k: _walk(v, leaf, f"{key}/{k}") for k, v in state.items()}
    return leaf(state, key)


def split_sharded(states: dict) -> tuple[dict, dict[str, Tensor]]:
    """``states`` (nested dicts) with every DTensor replaced by a marker, and ``{key: DTensor}``."""
    from torch.distributed.tensor import DTensor

    sharded: dict[str, Tensor] = {}

    def leaf(value, key):
        if not isinstance(value, DTensor):
            return value
        sharded[key] = value
        return {MARKER: key, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}

    return _walk(states, leaf, ""), sharded


def fill_sharded(states: dict, tensors: dict[str, Tensor]) -> dict:
    """``states`` with each marker replaced by ``tensors[its key]``."""
    return _walk(states, lambda v, key: tensors[v[MARKER]] if isinstance(v, dict) else v, "")


def shard_templates(states: dict, mesh) -> dict[str, Tensor]:
    """Empty DTensors (dim 0 split over ``mesh``, as FSDP2 splits weights) for every marker in ``states``, for
    ``torch.distributed.checkpoint.load`` to fill."""
    from torch.distributed.tensor import Shard, empty

    found: dict[str, Tensor] = {}

    def leaf(value, key):
        if isinstance(value, dict):
            found[value[MARKER]] = empty(value["shape"], dtype=getattr(torch, value["dtype"]), device_mesh=mesh,
                                         placements=[Shard(0)])
        return value

    _walk(states, leaf, "")
    return found


def load_consolidated(folder: str | Path) -> dict:
    """A sharded checkpoint folder as one full checkpoint dict in this process (no process group): whole tensors in
    ``state_dict``, the optimizer states and the callbacks' sharded state; the rest from ``meta.pt``. Holds the whole
    checkpoint in CPU memory."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    folder = Path(folder)
    tensors: dict[str, Any] = {}
    # the planner that rebuilds every saved tensor whole, as torch's own dcp_to_torch_save and Lightning's converter
    _load_state_dict(tensors, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    checkpoint = torch.load(folder / META, map_location="cpu", weights_only=False)
    sharded = tensors.pop(SHARDED_KEY, {})
    checkpoint.update(tensors)
    if "callbacks" in checkpoint:
        checkpoint["callbacks"] = fill_sharded(checkpoint["callbacks"], sharded)
    return checkpoint
