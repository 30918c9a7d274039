"""The vision-language processor of a Qwen pipeline folder (Qwen-Image-Edit's Qwen2-VL, Qwen-Image 2.1's Qwen3-VL),
loaded as ``model_index.json`` names it, as diffusers loads a pipeline component. transformers' processors hold a
video processor that transformers builds only with torchvision, so a folder naming one is refused without it."""

from __future__ import annotations

import importlib
import importlib.util


def processor_problem(index: dict, family: str) -> list[str]:
    """The problem of loading the processor ``index`` (a ``model_index.json``) names, before any weight loads.

    >>> processor_problem({"processor": ["mypackage", "MyProcessor"]}, "Qwen-Image 2.1")
    []
    """
    library, name = (index.get("processor") or [None, None])[:2]
    if library == "transformers" and importlib.util.find_spec("torchvision") is None:
        return [f"policy.model: {family}'s processor (transformers' {name}) needs torchvision; pip install "
                "'flowrl[editing]' (or torchvision, the build that matches your torch)"]
    return []


def load_processor(path: str, index: dict):
    """The processor of the folder ``path``, of the class ``index`` names (its ``processor`` subfolder)."""
    library, name = index["processor"]
    return getattr(importlib.import_module(library), name).from_pretrained(path, subfolder="processor")
