"""A policy's denoiser built from its config on the meta device: its module tree without a byte of weights.

What a check needs of the network before anything loads (the names of its modules, to tell whether a LoRA file
adapts this model or another family's) comes from the class and the config alone; under ``torch.device("meta")`` the
parameters take no memory and no initialisation runs on real storage.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

#: the diffusers class of the one network behind a policy's ``denoiser_kind`` (Wan's experts are two of one class)
DENOISER_CLASSES = {"WanExperts": "WanTransformer3DModel"}


def denoiser_skeleton(policy) -> nn.Module:
    """The denoiser of ``policy`` (built, not necessarily loaded) on the meta device, from ``denoiser_config``."""
    import diffusers

    name = DENOISER_CLASSES.get(policy.denoiser_kind, policy.denoiser_kind)
    with torch.device("meta"):
        return getattr(diffusers, name).from_config(dict(policy.denoiser_config))


def denoiser_module_names(policy) -> set[str]:
    """Every module name of the denoiser of ``policy``, known before its weights load."""
    return {name for name, _ in denoiser_skeleton(policy).named_modules()}


@contextmanager
def denoiser_on_meta(policy) -> Iterator[None]:
    """Within this context ``from_pretrained`` of the class of ``policy``'s denoiser builds the model from its config
    with its parameters on the meta device and reads no weights, so that ``policy.load()`` loads every other
    component as always and a denoiser skeleton whose weights come later (FSDP2's shards,
    :mod:`flowrl.strategies.sharded_load`).

    The families' ``_load_weights`` stay as they are (each calls its denoiser class's ``from_pretrained``); the
    skeleton is what ``from_pretrained`` returns bar the weights: the config from the same folder, ``torch_dtype``
    applied, in eval mode. Modules diffusers keeps in float32 get their dtypes from the reader's model.
    """
    import diffusers

    cls = getattr(diffusers, DENOISER_CLASSES.get(policy.denoiser_kind, policy.denoiser_kind))
    own = cls.__dict__.get("from_pretrained")

    def skeleton(klass, path, subfolder=None, torch_dtype=None, **_):
        from accelerate import init_empty_weights  # peft's dependency; what diffusers loads with

        # parameters on the meta device, but buffers and plain tensors that __init__ computes (Qwen-Image's rotary
        # frequencies) real, as from_pretrained builds them: no state dict carries the plain ones
        with init_empty_weights(include_buffers=False):
            model = klass.from_config(klass.load_config(path, subfolder=subfolder))
        return (model if torch_dtype is None else model.to(torch_dtype)).eval()

    cls.from_pretrained = classmethod(skeleton)
    try:
        yield
    finally:
        if own is None:
            del cls.from_pretrained
        else:
            cls.from_pretrained = own
