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
    skeleton is what ``from_pretrained`` returns bar the weights: the config from the same folder, each parameter in
    the dtype ``from_pretrained`` gives it (:func:`loaded_dtype`), in eval mode, and it remembers the folder its
    weights are in (``weights_source``: ``(path, subfolder)``), where FSDP2 reads each process's slices.
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
        for name, tensor in model.state_dict(keep_vars=True).items():  # the file's tensors: parameters, buffers
            tensor.data = tensor.data.to(loaded_dtype(klass, name, tensor.dtype, torch_dtype))
        model.weights_source = (path, subfolder)
        return model.eval()

    cls.from_pretrained = classmethod(skeleton)
    try:
        yield
    finally:
        if own is None:
            del cls.from_pretrained
        else:
            cls.from_pretrained = own


def loaded_dtype(cls, name: str, built: torch.dtype, torch_dtype=None) -> torch.dtype:
    """The dtype ``cls.from_pretrained(..., torch_dtype=torch_dtype)`` gives the floating tensor ``name`` of the file
    (``built``: its dtype in the model built from the config): ``torch_dtype``, but float32 in the modules the class
    keeps in float32 (``_keep_in_fp32_modules``, matched against the name's parts, as diffusers does), and the built
    dtype without a ``torch_dtype``."""
    if torch_dtype is None or not built.is_floating_point:
        return built
    keep = cls._keep_in_fp32_modules or []
    keep = [keep] if isinstance(keep, str) else keep
    return torch.float32 if any(m in name.split(".") for m in keep) else torch_dtype
