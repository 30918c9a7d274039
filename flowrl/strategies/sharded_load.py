"""The trained denoiser loaded into its FSDP2 shards, each process reading only its own slices of the weights.

Under ``fsdp2`` on N processes every rank loads the policy with the denoiser built on the meta device
(:func:`~flowrl.policies.skeleton.denoiser_on_meta`): the frozen components (VAE, text encoders: they stay whole,
:mod:`flowrl.policies.sharding`) load as always, and LoRA and the method's adapters are made for real beside the
meta weights, drawing from the policy's initialisation stream as a 1-process load does (peft makes them on the CPU
before it moves them to their base layer's device, which it is kept from doing here), so they hold the same values
and leave the same random state on every rank. Every rank shards the skeleton with the plan, then fills each FSDP
unit's meta tensors with its own rows of the model folder's safetensors files
(:mod:`flowrl.strategies.safetensors_slices`), unit by unit, in the dtypes ``from_pretrained`` gives them. A rank
holds its shard (1/N) plus the file pages of one unit's slices at a time; nothing is sent between ranks. A full
fine-tuning reference (a copy of the meta denoiser) reads the same files.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from flowrl.policies.sharding import denoiser_blocks, shard_policy
from flowrl.policies.skeleton import denoiser_on_meta
from flowrl.strategies.safetensors_slices import model_folder, read_rows, tensor_files

#: the policy's modules that FSDP2 shards (:func:`flowrl.policies.sharding.shard_policy`) and that load here
ROOTS = ("denoiser", "reference_denoiser")


def load_into_shards(policy, load: Callable[[], object], mesh, reshard_after_forward: bool = True) -> list[str]:
    """Run ``load`` (which loads ``policy``'s weights: ``BaseModule.load_weights``, or ``policy.load``) with the
    trained denoiser built on the meta device, shard it over ``mesh`` and read every rank's slices of its weights
    from the model's safetensors files; returns the sharded modules' names. Every process of the mesh calls it.

    Raises:
        RuntimeError: a tensor of the denoiser that is in no file of its folder and was not made by the load.
        FileNotFoundError: a model folder without safetensors weights.
    """
    with denoiser_on_meta(policy), adapters_beside_meta():
        load()
    roots = {name: getattr(policy, name) for name in ROOTS if getattr(policy, name, None) is not None}
    units = {name: unit_keys(root, list(root.state_dict())) for name, root in roots.items()}  # the plan reads names
    sharded = shard_policy(policy, mesh, reshard_after_forward)
    for name, root in roots.items():
        sources = file_keys(root)
        for keys in units[name]:
            fill_unit(root, [k for k in keys if k in sources], sources, torch.device(mesh.device_type))
    _refuse_meta(roots)
    return sharded


def unit_keys(root: nn.Module, keys: list[str]) -> list[list[str]]:
    """``keys`` (of ``root``'s state dict, in order) in runs that belong to one FSDP unit each (a block of the
    plan, :func:`~flowrl.policies.sharding.denoiser_blocks`, or the root): what one fill reads."""
    prefixes = sorted((f"{name}." for name, _ in denoiser_blocks(root)), key=len, reverse=True)
    runs, unit = [], object()
    for key in keys:
        owner = next((p for p in prefixes if key.startswith(p)), "")
        if owner != unit:
            runs.append([])
            unit = owner
        runs[-1].append(key)
    return runs


def file_keys(root: nn.Module) -> dict[str, tuple[str, str]]:
    """For every tensor of ``root``'s state dict that a skeleton's files hold: ``(file, name in the file)``. A
    skeleton (a module with ``weights_source``) holds its state dict's names bar peft's ``base_layer`` level; LoRA's
    tensors are in no file."""
    out = {}
    for prefix, module in root.named_modules():
        source = getattr(module, "weights_source", None)
        if source is None:
            continue
        files = tensor_files(model_folder(*source))
        for key in module.state_dict(keep_vars=True):
            stored = key.replace(".base_layer.", ".")
            if stored in files:
                out[f"{prefix}.{key}" if prefix else key] = (str(files[stored]), stored)
    return out


def fill_unit(root: nn.Module, keys: list[str], sources: dict[str, tuple[str, str]], device: torch.device) -> None:
    """Read this rank's rows of ``keys`` (one FSDP unit's tensors of ``root``) from their files into ``root`` on
    ``device``: a sharded parameter gets its shard's rows, a whole tensor all of them, each in the skeleton's dtype."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    current, values = root.state_dict(keep_vars=True), {}
    with ExitStack() as files:  # unmapped once read: a rank's mapped pages are one unit's slices at a time
        handles = {}
        for key in keys:
            file, stored = sources[key]
            if file not in handles:
                handles[file] = files.enter_context(safe_open(file, "pt"))
            tensor = current[key]
            if not isinstance(tensor, DTensor):  # a tensor FSDP2 leaves whole (a buffer)
                values[key] = read_rows(handles[file], stored, 0, len(tensor) if tensor.dim() else 0,
                                        tensor.dtype).to(device)
                continue
            shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
            rows = read_rows(handles[file], stored, offset[0], offset[0] + shape[0], tensor.dtype)
            values[key] = DTensor.from_local(rows.to(device), tensor.device_mesh, tensor.placements, run_check=False,
                                             shape=tensor.shape, stride=tensor.stride())
    root.load_state_dict(values, strict=False, assign=True)


@contextmanager
def adapters_beside_meta() -> Iterator[None]:
    """Within this context nothing moves to the meta device (``Module.to("meta", dtype)`` only casts): peft moves a
    new adapter to its base layer's device, which is the meta device for a skeleton's layer, and LoRA's initial
    values, made on the CPU as a 1-process load makes them, are kept."""
    own = nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta":
            return own(self, dtype) if dtype is not None else self
        return own(self, *args, **kwargs)

    nn.Module.to = to
    try:
        yield
    finally:
        nn.Module.to = own


def _refuse_meta(roots: dict[str, nn.Module]) -> None:
    """Raises RuntimeError if any tensor of ``roots`` is left on the meta device (no value loaded into it)."""
    left = [f"{name}.{n}" for name, root in roots.items() for n, t in _tensors(root) if t.is_meta]
    if left:
        raise RuntimeError(f"no weights loaded into {left[:3]} ({len(left)} tensors) under fsdp2: they are in no "
                           "safetensors file of the denoiser's folder")


def _tensors(root: nn.Module):
    """``(name, tensor)`` of every parameter and buffer of ``root`` (each shared tensor once)."""
    yield from root.named_parameters()
    yield from root.named_buffers()
