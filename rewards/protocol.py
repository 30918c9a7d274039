"""The reward server's wire format: images and scores as JSON, shared by ``serve`` and ``RemoteReward``.

Request (``POST /score``)::

    {"images": {"encoding": "png", "data": [<base64 PNG>, ...]}          # 8-bit RGB, one PNG per image
            or {"encoding": "array", "shape": [B, 3, H, W], "data": <base64 of float32 little-endian bytes>},
     "prompts": [B strings], "metadata": {"seeds": [B ints], ...}, "rewards": ["name", ...] (optional: all)}

Response::

    {"scores": {"name": [B floats or null]}, "batch_requests": k, "batch_images": n}

``null`` is a non-finite score (JSON has no NaN); ``batch_requests`` / ``batch_images`` say how many requests and
images the server scored together with this one (its batching of concurrent requests).
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

ENCODINGS = ("png", "array")


def encode_images(images: Tensor, encoding: str = "png") -> dict[str, Any]:
    """JSON-ready images ``[B, 3, H, W]`` in ``[0, 1]``: 8-bit PNGs (small) or exact float32 arrays.

    >>> x = torch.rand(2, 3, 4, 5)
    >>> torch.equal(decode_images(encode_images(x, "array")), x)
    True
    >>> torch.equal(decode_images(encode_images(x, "png")), (x * 255).round() / 255)
    True
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding={encoding!r}; choose one of {ENCODINGS}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [B, 3, H, W]; got {tuple(images.shape)}")
    images = images.detach().float().cpu()
    if encoding == "array":
        data = images.contiguous().numpy().astype("<f4").tobytes()
        return {"encoding": "array", "shape": list(images.shape), "data": base64.b64encode(data).decode()}
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    pngs = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="PNG", compress_level=1)
        pngs.append(base64.b64encode(buffer.getvalue()).decode())
    return {"encoding": "png", "data": pngs}


def decode_images(payload: dict[str, Any]) -> Tensor:
    """Images ``[B, 3, H, W]`` float32 in ``[0, 1]`` from :func:`encode_images`' output; ``ValueError`` if malformed."""
    encoding = payload.get("encoding") if isinstance(payload, dict) else None
    if encoding == "array":
        shape = [int(s) for s in payload["shape"]]
        flat = np.frombuffer(base64.b64decode(payload["data"]), dtype="<f4")
        if len(shape) != 4 or shape[1] != 3 or flat.size != math.prod(shape):
            raise ValueError(f"array images: shape {shape} must be [B, 3, H, W] and match {flat.size} values")
        return torch.from_numpy(flat.copy()).reshape(shape)
    if encoding == "png":
        arrays = [np.asarray(Image.open(io.BytesIO(base64.b64decode(d))).convert("RGB")) for d in payload["data"]]
        if not arrays or len({a.shape for a in arrays}) != 1:
            raise ValueError("png images: expected at least one image, all of one size")
        return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255
    raise ValueError(f"images.encoding={encoding!r}; choose one of {ENCODINGS}")


def encode_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """Tensors as lists; other values kept (they must be JSON-serialisable)."""
    return {k: v.tolist() if torch.is_tensor(v) else v for k, v in (metadata or {}).items()}


def decode_metadata(metadata: dict[str, Any], batch: int) -> dict[str, Any]:
    """Lists of ``batch`` numbers become tensors again (``seeds``, ``group_ids``...)."""
    out = {}
    for key, value in (metadata or {}).items():
        numeric = isinstance(value, list) and len(value) == batch and all(isinstance(v, (int, float)) for v in value)
        out[key] = torch.tensor(value) if numeric else value
    return out


def encode_scores(scores: dict[str, Tensor]) -> dict[str, list]:
    """``{name: [B]}`` as JSON lists, ``None`` for non-finite values.

    >>> encode_scores({"a": torch.tensor([1.5, float("nan")])})
    {'a': [1.5, None]}
    """
    return {name: [float(v) if math.isfinite(v) else None for v in s.float().tolist()] for name, s in scores.items()}


def decode_scores(scores: dict[str, list]) -> dict[str, Tensor]:
    """The inverse of :func:`encode_scores` (``None`` -> NaN)."""
    return {name: torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
            for name, values in scores.items()}
