"""A model folder's tensors read a slice at a time from its safetensors files: what one process of FSDP2 holds of a
weight, without reading the rest.

``safe_open`` maps a file and ``get_slice(name)[start:stop]`` copies only the rows asked for, so a process touches
the file's pages of its own rows (FSDP2 shards every weight along its first dimension). The files are those
``from_pretrained`` reads: one ``*.safetensors`` file, or the shards an ``*.safetensors.index.json`` names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch


def model_folder(path: str, subfolder: Optional[str] = None) -> Path:
    """The local folder of a model (``from_pretrained``'s ``path`` and ``subfolder``), downloaded from the hub (to
    its cache, as ``from_pretrained`` would) when ``path`` is a hub id."""
    local = Path(path, subfolder or "")
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    pattern = f"{subfolder}/*" if subfolder else "*"
    return Path(snapshot_download(path, allow_patterns=[pattern]), subfolder or "")


def tensor_files(folder: Path) -> dict[str, Path]:
    """Every tensor name of the folder's safetensors weights and the file holding it.

    Raises:
        FileNotFoundError: a folder without safetensors weights (``.bin`` files cannot be read a slice at a time).
    """
    from safetensors import safe_open

    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        return {name: folder / file for name, file in json.loads(indexes[0].read_text())["weight_map"].items()}
    files = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            files.update((name, file) for name in f.keys())
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}: under fsdp2 each process reads only its own "
                                "slices, which needs .safetensors files; convert the weights (save_pretrained with "
                                "safe_serialization) or load with --trainer.strategy=ddp")
    return files


def read_rows(handle, name: str, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``start:stop`` of tensor ``name`` of an open ``safe_open`` file (all of a 0-d tensor), as ``dtype``."""
    piece = handle.get_slice(name)
    rows = piece[:] if len(piece.get_shape()) == 0 else piece[start:stop]
    return rows.to(dtype)
