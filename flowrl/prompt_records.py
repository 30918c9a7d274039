"""Prompt records: a prompt and the images it is conditioned on (a video's first frame, an edit's source images).

A ``.jsonl`` prompt file may give each record its images, paths relative to the file's folder (or absolute):

    {"prompt": "the cat turns its head", "images": ["frames/cat.png"]}

Inline lists and ``.txt`` files hold prompts only. The data module hands each batch row its prompt's images as
float tensors ``[3, H, W]`` in ``[0, 1]`` (``batch["images"]``, one list per row), read as diffusers' ``load_image``
reads a file (EXIF orientation applied, RGB), each distinct record once per batch.

:func:`prompt_record_problems` checks the data module's prompt sources against the policy's
``conditioning_images`` before any weight loads (:func:`data_record_problems` reads both from the built objects):
missing or unreadable images and wrong counts, each naming the key, the file, the line and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

#: the data module's keys that hold prompt sources
SOURCE_KEYS = ("prompts", "val_prompts", "predict_prompts")
#: problems listed per source before the rest are counted
MAX_LISTED = 5


@dataclass(frozen=True)
class PromptRecord:
    """One prompt; ``images`` resolved to paths; ``line`` its 1-based line in ``source`` (0: not from a file)."""

    prompt: str
    images: tuple[Path, ...] = ()
    line: int = 0
    source: str = ""


def load_records(source: Union[str, Sequence[str]]) -> list[PromptRecord]:
    """The records of an inline list, a ``.txt`` file (no images) or a ``.jsonl`` file (``images`` optional).

    Raises:
        FileNotFoundError: no such file. ValueError: a line that is not a JSON object with a ``prompt`` string and an
            optional ``images`` list of strings (every such line named), or no prompt at all.
    """
    if isinstance(source, (list, tuple)):
        records = [PromptRecord(str(p)) for p in source]
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {source!r} does not exist; give a .txt/.jsonl path or a list")
        lines = [(n, line.strip()) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
        if path.suffix == ".jsonl":
            parsed = [_parse_line(text, n, path) for n, text in lines]
            if problems := [p for p in parsed if isinstance(p, str)]:
                raise ValueError(f"prompt file {source}:\n  " + "\n  ".join(problems))
            records = parsed
        else:
            records = [PromptRecord(text, line=n, source=str(path)) for n, text in lines]
    if not records:
        raise ValueError(f"no prompts found in {source!r}; a run needs at least one prompt")
    return records


def _parse_line(text: str, number: int, path: Path) -> Union[PromptRecord, str]:
    """The record on one line, or the problem with it."""
    fix = 'each line must be an object such as {"prompt": "a cat", "images": ["cat.png"]}'
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        return f"line {number} is not JSON ({err.msg}); {fix}"
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        return f"line {number} has no \"prompt\" string; {fix}"
    images = row.get("images", [])
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        return f"line {number}: \"images\" must be a list of file paths (relative to {path.parent}); {fix}"
    return PromptRecord(row["prompt"], tuple(path.parent / Path(i).expanduser() for i in images), number, str(path))


def load_image(path: Union[str, Path]) -> Tensor:
    """An image file as ``[3, H, W]`` float32 in ``[0, 1]`` (EXIF orientation applied, RGB, as ``load_image``;
    high-bit grayscale scaled, not clipped to white: :func:`~flowrl.rewards.pil_images.unit_pixels`)."""
    from PIL import Image, ImageOps

    from flowrl.rewards.pil_images import unit_pixels

    with Image.open(path) as image:
        pixels = unit_pixels(ImageOps.exif_transpose(image))
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def count_problem(count: int, conditioning_images: int, policy: str) -> Optional[str]:
    """Why ``count`` images do not fit a policy taking ``conditioning_images`` (0 none, -1 at least one), or None.

    >>> count_problem(2, 1, "WanI2VPolicy")
    'has 2 images; WanI2VPolicy takes exactly 1 per prompt'
    >>> count_problem(0, -1, "an editing policy"), count_problem(3, -1, "an editing policy") is None
    ('has no images; an editing policy takes at least 1 per prompt', True)
    """
    if conditioning_images == 0:
        return None if count == 0 else (f"has {count} images; {policy} takes none (text only): use a policy that "
                                        "conditions on images")
    if conditioning_images < 0:
        return None if count >= 1 else f"has no images; {policy} takes at least 1 per prompt"
    if count == conditioning_images:
        return None
    return f"has {count} images; {policy} takes exactly {conditioning_images} per prompt"


#: the smallest side a source image may have: the VAE's 8x downscale with 2x2 patches, the unit every policy's
#: resize rounds to (a 2-pixel sliver would be resized to a side of 0, or to tens of thousands of pixels)
MIN_SIDE = 16


def _image_problem(image: Path) -> Optional[str]:
    """Why ``image`` cannot be a source, found by decoding every pixel as training will (``verify()`` alone reads
    headers and checksums: a cut-off JPEG or a corrupt stream would pass it and fail hours in)."""
    from PIL import Image, UnidentifiedImageError

    if not image.is_file():
        return f"image {str(image)!r} does not exist (paths are relative to the .jsonl file's folder)"
    try:
        with Image.open(image) as opened:
            opened.verify()  # headers and (PNG) checksums
        with Image.open(image) as opened:
            opened.load()  # every pixel, as the data module will decode it
            size = opened.size
    except Image.DecompressionBombError as err:
        return (f"image {str(image)!r} is too large to decode safely ({err}); re-save it smaller (the policy resizes "
                "sources anyway)")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        return f"image {str(image)!r} cannot be read as an image ({err}); re-save it as PNG or JPEG"
    if min(size) < MIN_SIDE:
        return (f"image {str(image)!r} is {size[0]} x {size[1]} px; a source needs at least {MIN_SIDE} px on each "
                "side (the VAE's 8x downscale with 2x2 patches); re-save it larger")
    return None


def record_problems(source: Any, key: str, conditioning_images: int, policy: str = "the policy") -> list[str]:
    """Problems of one prompt source against a policy taking ``conditioning_images`` per prompt, each naming
    ``key``, the file, the line and the fix (at most :data:`MAX_LISTED`, then a count of the rest)."""
    try:
        records = load_records(source)
    except (OSError, ValueError) as err:
        return [f"{key}: {err}"]
    if conditioning_images and not (isinstance(source, str) and source.endswith(".jsonl")):
        return [f"{key}: {policy} conditions every prompt on images, but {key} gives prompts only; give a .jsonl "
                "file whose records carry an \"images\" list of paths"]
    problems = []
    for record in records:
        where = f"{key}={record.source} line {record.line}"
        if (wrong := count_problem(len(record.images), conditioning_images, policy)) is not None:
            fix = " (or drop the \"images\" lists)" if conditioning_images == 0 else ""
            problems.append(f"{where} {wrong}{fix}")
            continue
        problems += [f"{where}: {p}" for image in record.images if (p := _image_problem(image)) is not None]
    if len(problems) > MAX_LISTED:
        problems = problems[:MAX_LISTED] + [f"{key}: ... and {len(problems) - MAX_LISTED} more such problems"]
    return problems


def prompt_record_problems(data: Mapping[str, Any], conditioning_images: int,
                           policy: str = "the policy") -> list[str]:
    """Every prompt source of a parsed data config (``data.init_args`` of ``PromptDataModule``: ``prompts``,
    ``val_prompts``, ``predict_prompts``) against the policy's ``conditioning_images`` (its class attribute), before
    any weight loads. Sources that are missing or not given are left to the other checks."""
    problems = []
    for name in SOURCE_KEYS:
        source = data.get(name)
        if source is None or (isinstance(source, str) and not Path(source).expanduser().is_file()):
            continue
        problems += record_problems(source, f"data.{name}", conditioning_images, policy)
    return problems


def data_sources(data: Any) -> dict[str, Any]:
    """``{data key: the source it gives}`` of a built ``PromptDataModule`` (the prompts, validation and predict
    prompts, as given: a file's path or a list)."""
    return {"prompts": data.prompt_source, "val_prompts": data.val_source, "predict_prompts": data.predict_source}


def data_record_problems(data: Any, policy: Any) -> list[str]:
    """:func:`prompt_record_problems` of a built data module against a built policy's ``conditioning_images`` (no
    weight loads: a policy reads only its configs when built; a Qwen-Image-Edit folder sets its own count)."""
    return prompt_record_problems(data_sources(data), policy.conditioning_images, type(policy).__name__)


def source_images(source: Any, key: str, trainer: Any = None) -> Optional["RecordImages"]:
    """The images of ``source``'s records (None: a source without images or none given), first checked against the
    ``conditioning_images`` of the trainer's policy (the data module's setup: the config check's second line).

    Raises:
        ValueError: every problem :func:`record_problems` finds, together.
    """
    if source is None:
        return None
    policy = getattr(getattr(trainer, "lightning_module", None), "policy", None)
    if policy is not None and (problems := record_problems(source, key, policy.conditioning_images,
                                                           type(policy).__name__)):
        raise ValueError("invalid prompt records:\n  " + "\n  ".join(problems))
    return RecordImages.of(load_records(source))


class RecordImages:
    """The images of a source's records, loaded for a batch's rows (each distinct record once per call)."""

    def __init__(self, records: Sequence[PromptRecord]):
        self.records = list(records)

    @staticmethod
    def of(records: Sequence[PromptRecord]) -> Optional["RecordImages"]:
        """None when no record has images (batches then carry no ``images``)."""
        return RecordImages(records) if any(r.images for r in records) else None

    def __call__(self, prompt_ids: Sequence[int]) -> list[list[Tensor]]:
        loaded = {i: [self._load(self.records[i], p) for p in self.records[i].images]
                  for i in dict.fromkeys(prompt_ids)}
        return [loaded[i] for i in prompt_ids]

    @staticmethod
    def _load(record: PromptRecord, path: Path) -> Tensor:
        try:
            return load_image(path)
        except OSError as err:  # checked before loading; changed since (a sync, an edit): name it, not a bare OSError
            raise OSError(f"{record.source} line {record.line}: image {str(path)!r} cannot be read ({err}); it was "
                          "readable when the run started: restore or re-save it and resume") from err

    def collating(self, collate: Callable[[list[dict]], dict], seeds_per_prompt: int) -> Callable[[list[dict]], dict]:
        """``collate`` of predict rows (``{"row": r, ...}``, prompt ``r // seeds_per_prompt``) with their images."""
        return lambda rows: {**collate(rows), "images": self([r["row"] // seeds_per_prompt for r in rows])}
