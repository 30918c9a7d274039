"""The reward server's wire format: images and scores as JSON, shared by ``serve`` and ``RemoteReward``.

Request (``POST /score``):

    {"images": {"encoding": "png", "data": [<base64 PNG>, ...]}          # 8-bit RGB, one PNG per image
            or {"encoding": "array", "shape": [B, 3, H, W], "data": <base64 of float32 little-endian bytes>},
               # clips: {"encoding": "png", "frames": F, "data": [B * F PNGs, clip by clip]}
               #     or {"encoding": "array", "shape": [B, F, 3, H, W], "data": ...}
     "prompts": [B strings], "metadata": {"seeds": [B ints], ...}, "rewards": ["name", ...] (optional: all)}

Response:

    {"scores": {"name": [B floats or null]}, "batch_requests": k, "batch_images": n}

``null`` is a non-finite score (JSON has no NaN); ``batch_requests`` / ``batch_images`` say how many requests and
images the server scored together with this one (its batching of concurrent requests).

Errors: ``{"detail": "<what is wrong and how to fix it>", "batch_requests": k}`` with status 400 for a malformed
request (:func:`decode_score_request` names the field) or one a reward rejects (its name and message), 500 when a
reward fails on its own. Each request of a batch gets its own answer.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from flowrl.rewards.pil_images import unit_pixels

ENCODINGS = ("png", "array")


def encode_images(images: Tensor, encoding: str = "png") -> dict[str, Any]:
    """JSON-ready images ``[B, 3, H, W]`` or clips ``[B, F, 3, H, W]`` in ``[0, 1]``: 8-bit PNGs (small; a clip's
    frames in order, with ``frames``) or exact float32 arrays.

    >>> x, clips = torch.rand(2, 3, 4, 5), torch.rand(2, 3, 3, 4, 5)
    >>> torch.equal(decode_images(encode_images(x, "array")), x)
    True
    >>> torch.equal(decode_images(encode_images(x, "png")), (x * 255).round() / 255)
    True
    >>> torch.equal(decode_images(encode_images(clips, "png")), (clips * 255).round() / 255)
    True
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding={encoding!r}; choose one of {ENCODINGS}")
    if images.ndim not in (4, 5) or images.shape[-3] != 3:
        raise ValueError(f"expected images [B, 3, H, W] or clips [B, F, 3, H, W]; got {tuple(images.shape)}")
    images = images.detach().float().cpu()
    if encoding == "array":
        data = images.contiguous().numpy().astype("<f4").tobytes()
        return {"encoding": "array", "shape": list(images.shape), "data": base64.b64encode(data).decode()}
    if images.ndim == 5:
        return {**encode_images(images.flatten(0, 1), "png"), "frames": images.shape[1]}
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    pngs = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="PNG", compress_level=1)
        pngs.append(base64.b64encode(buffer.getvalue()).decode())
    return {"encoding": "png", "data": pngs}


def decode_images(payload: Any) -> Tensor:
    """Images ``[B, 3, H, W]`` or clips ``[B, F, 3, H, W]`` float32 in ``[0, 1]`` from :func:`encode_images`' output.

    Raises ``ValueError`` naming the field and the fix for anything else: a missing or unknown ``encoding``, data
    that is not base64 or not a PNG, PNGs of several sizes, no images at all, an array whose ``shape`` does not
    match its data, or PNGs that do not fill whole clips of ``frames``.

    >>> decode_images({"encoding": "png", "data": []})
    Traceback (most recent call last):
    ...
    ValueError: images.data is empty: send at least one base64 PNG
    >>> decode_images({"encoding": "png", "data": ["aGVsbG8="]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: images.data[0] is not a base64 PNG image: ...
    """
    if not isinstance(payload, dict):
        raise ValueError(f"images must be an object {{\"encoding\": \"png\" | \"array\", \"data\": ...}}; "
                         f"got {json_type_name(payload)}")
    encoding = payload.get("encoding")
    if encoding not in ENCODINGS:
        raise ValueError(f"images.encoding={encoding!r}; choose one of {ENCODINGS}")
    data = payload.get("data")
    if encoding == "array":
        shape = payload.get("shape")
        if not (isinstance(shape, list) and len(shape) in (4, 5) and all(type(s) is int and s > 0 for s in shape)
                and shape[-3] == 3):
            raise ValueError(f"images.shape={shape!r} must be [B, 3, H, W] or [B, F, 3, H, W] with B, F, H, W >= 1 "
                             f"(array encoding)")
        if not isinstance(data, str):
            raise ValueError(f"images.data must be a base64 string of float32 values (array encoding); "
                             f"got {json_type_name(data)}")
        flat = np.frombuffer(_b64decode(data, "images.data"), dtype="<u1")
        if flat.size != 4 * math.prod(shape):
            raise ValueError(f"images.data holds {flat.size} bytes but images.shape={shape} needs "
                             f"{4 * math.prod(shape)} (float32 little-endian)")
        return torch.from_numpy(flat.view("<f4").astype(np.float32)).reshape(shape)
    frames = payload.get("frames")
    if frames is not None and not (type(frames) is int and frames >= 1 and isinstance(data, list)
                                   and len(data) % frames == 0):
        raise ValueError(f"images.frames={frames!r} must be a whole number of frames per clip that divides the "
                         f"{len(data) if isinstance(data, list) else '?'} PNGs of images.data")
    if frames is not None:
        images = decode_images({"encoding": "png", "data": data})
        return images.view(len(data) // frames, frames, *images.shape[1:])
    if not isinstance(data, list):
        raise ValueError(f"images.data must be a list of base64 PNG strings; got {json_type_name(data)}")
    if not data:
        raise ValueError("images.data is empty: send at least one base64 PNG")
    arrays = []
    for i, item in enumerate(data):
        if not isinstance(item, str):
            raise ValueError(f"images.data[{i}] must be a base64 PNG string; got {json_type_name(item)}")
        raw = _b64decode(item, f"images.data[{i}]")
        try:
            with Image.open(io.BytesIO(raw)) as image:
                arrays.append(unit_pixels(image))  # a 16-bit PNG scaled, not clipped to white
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:  # not an image, truncated
            reason = "not an image file" if isinstance(err, UnidentifiedImageError) else str(err)
            raise ValueError(f"images.data[{i}] is not a base64 PNG image: {reason}") from err
    sizes = sorted({a.shape[:2] for a in arrays})
    if len(sizes) != 1:
        raise ValueError(f"images.data holds PNGs of several sizes {sizes}; send one size per request")
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _b64decode(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"{field} is not valid base64: {err}") from err


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def decode_score_request(body: Any) -> dict[str, Any]:
    """A ``POST /score`` body checked and decoded: ``{"images", "prompts", "names", "metadata"}``.

    ``names`` is None where the request does not choose rewards. Raises ``ValueError`` naming the field and the fix
    when the body is malformed (wrong types, no images, images that do not decode, prompts that do not match).

    >>> decode_score_request({"images": encode_images(torch.rand(2, 3, 4, 4)), "prompts": "a cat"})
    Traceback (most recent call last):
    ...
    ValueError: prompts must be a list of strings, one per image (2); got a string (wrap a single prompt in a list)
    >>> x = encode_images(torch.rand(1, 3, 4, 4))
    >>> decode_score_request({"images": x, "prompts": ["p"], "rewards": "jpeg"})
    Traceback (most recent call last):
    ...
    ValueError: rewards must be a list of reward names, e.g. ["jpeg"]; got a string
    """
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object {{\"images\": ..., \"prompts\": [...]}}; "
                         f"got {json_type_name(body)}")
    missing = [k for k in ("images", "prompts") if k not in body]
    if missing:
        raise ValueError(f"the body lacks {missing}: send {{\"images\": ..., \"prompts\": [...]}}")
    images = decode_images(body["images"])
    count, prompts = images.shape[0], body["prompts"]
    if not isinstance(prompts, list):
        hint = " (wrap a single prompt in a list)" if isinstance(prompts, str) else ""
        raise ValueError(f"prompts must be a list of strings, one per image ({count}); "
                         f"got {json_type_name(prompts)}{hint}")
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        raise ValueError(f"prompts[{bad[0]}] is {json_type_name(prompts[bad[0]])}; every prompt must be a string")
    if len(prompts) != count:
        raise ValueError(f"{count} images but {len(prompts)} prompts: send one prompt per image")
    names = body.get("rewards")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            example = f'["{names}"]' if isinstance(names, str) else '["jpeg_compressibility"]'
            raise ValueError(f"rewards must be a list of reward names, e.g. {example}; "
                             f"got {json_type_name(names)}")
        names = names or None  # [] asks for every reward, as a missing key does
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be an object such as {{\"seeds\": [...]}}; "
                         f"got {json_type_name(metadata)}")
    return {"images": images, "prompts": prompts, "names": names, "metadata": decode_metadata(metadata, count)}


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
