"""A policy's denoiser built from its config on the meta device: its module tree without a byte of weights.

What a check needs of the network before anything loads (the names of its modules, to tell whether a LoRA file
adapts this model or another family's) comes from the class and the config alone; under ``torch.device("meta")`` the
parameters take no memory and no initialisation runs on real storage.
"""

from __future__ import annotations

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
