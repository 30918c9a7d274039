"""The trained denoiser loaded into its FSDP2 shards from one reader: no other process holds it whole.

Under ``fsdp2`` on N processes, rank zero loads the policy as one process does (``from_pretrained`` of every
component, LoRA, the method's adapters and reference), while every other rank loads the frozen components (VAE, text
encoders: they stay whole, :mod:`flowrl.policies.sharding`) and builds the denoiser on the meta device
(:func:`~flowrl.policies.skeleton.denoiser_on_meta`), where LoRA and the method's adapters take no memory. Rank zero
keeps its loaded tensors in a state dict and puts its modules on the meta device too; every rank shards the
skeleton with the same plan, and torch's ``set_model_state_dict`` (``full_state_dict``, ``broadcast_from_rank0``)
sends rank zero's tensors one at a time, FSDP unit by unit, each rank keeping its slice. A rank other than zero holds
its shard plus one whole tensor at a time; rank zero the whole denoiser as read, shrinking to its shard as each
unit's whole tensors are sent and freed (torchtune's FSDP2 recipes load the same way).

The numbers are those of loading on every rank: the values are rank zero's, and so is the random state after the
load (LoRA's initialisation drew from it on rank zero; the meta skeletons of the other ranks draw nothing, or not the
same), which every rank would have reached from the same seed. What the state dict leaves out travels too: each
tensor's dtype (diffusers keeps some modules in float32) before sharding, the non-persistent buffers after.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from flowrl.policies.sharding import denoiser_blocks, shard_policy
from flowrl.policies.skeleton import denoiser_on_meta

#: the policy's modules that FSDP2 shards (:func:`flowrl.policies.sharding.shard_policy`) and that load here
ROOTS = ("denoiser", "reference_denoiser")


def load_into_shards(policy, load: Callable[[], object], mesh, reshard_after_forward: bool = True) -> list[str]:
    """Run ``load`` (which loads ``policy``'s weights: ``BaseModule.load_weights``, or ``policy.load``) with the
    trained denoiser read by global rank zero only, then shard it over ``mesh`` and fill every rank's shards from rank
    zero's tensors; returns the sharded modules' names. Every process of the default process group calls it.

    Raises:
        RuntimeError: the denoiser a rank built on the meta device is not rank zero's (its tensors' names differ),
            or a tensor got no value.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    reader = dist.get_rank() == 0
    with nullcontext() if reader else denoiser_on_meta(policy):
        load()
    roots = {name: getattr(policy, name) for name in ROOTS if getattr(policy, name, None) is not None}
    full = {name: root.state_dict() for name, root in roots.items()} if reader else {}
    box = [_description(policy, roots) if reader else None]
    dist.broadcast_object_list(box, src=0)
    units = {name: unit_keys(root, box[0]["keys"][name]) for name, root in roots.items()}  # the plan reads names
    _skeletons(policy, roots, box[0])
    sharded = shard_policy(policy, mesh, reshard_after_forward)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    for name, root in roots.items():
        for keys in units[name]:  # rank zero frees each unit's whole tensors once sent
            set_model_state_dict(root, {k: full[name].pop(k) for k in keys} if reader else {}, options=options)
        _set_buffers(root, box[0]["buffers"][name])
    _refuse_meta(roots)
    return sharded


def unit_keys(root: nn.Module, keys: list[str]) -> list[list[str]]:
    """``keys`` (of ``root``'s state dict, in order) in runs that belong to one FSDP unit each (a block of the
    plan, :func:`~flowrl.policies.sharding.denoiser_blocks`, or the root): what one ``set_model_state_dict`` fills."""
    prefixes = sorted((f"{name}." for name, _ in denoiser_blocks(root)), key=len, reverse=True)
    runs, unit = [], object()
    for key in keys:
        owner = next((p for p in prefixes if key.startswith(p)), "")
        if owner != unit:
            runs.append([])
            unit = owner
        runs[-1].append(key)
    return runs


def _description(policy, roots: dict[str, nn.Module]) -> dict:
    """What rank zero's loaded policy tells every rank besides the tensors' values: the state dicts' keys, every
    tensor's dtype, the non-persistent buffers (on the CPU) and the random state after the load."""
    return {"keys": {name: list(root.state_dict()) for name, root in roots.items()},
            "dtypes": {name: {n: t.dtype for n, t in _tensors(root)} for name, root in roots.items()},
            "buffers": {name: {n: b.cpu() for n, b in _non_persistent(root)} for name, root in roots.items()},
            "rng": torch.get_rng_state(), "init_rng": policy._init_rng}


def _skeletons(policy, roots: dict[str, nn.Module], told: dict) -> None:
    """Every rank's ``roots`` on the meta device in rank zero's dtypes (rank zero's values wait in its state
    dicts), and rank zero's random state.

    Raises:
        RuntimeError: a rank's skeleton's tensors are not those of rank zero's model (a family whose load builds
            something else than its denoiser class's ``from_pretrained`` returns).
    """
    for name, root in roots.items():
        dtypes, mine = told["dtypes"].get(name, {}), dict(_tensors(root.to("meta")))
        if set(dtypes) != set(mine):
            raise RuntimeError(f"the {name} built on the meta device differs from rank zero's loaded one (e.g. "
                               f"{sorted(set(dtypes) ^ set(mine))[:3]}): this policy cannot load one shard per "
                               "process under fsdp2")
        for n, t in mine.items():
            t.data = t.data.to(dtypes[n])
    torch.set_rng_state(told["rng"])
    policy._init_rng = told["init_rng"]


def _set_buffers(root: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    """Rank zero's non-persistent buffers (no state dict carries them) into ``root``, on its parameters' device."""
    device = next(p for p in root.parameters() if not p.is_meta).device
    for name, value in buffers.items():
        owner, _, attr = name.rpartition(".")
        root.get_submodule(owner)._buffers[attr] = value.to(device)


def _refuse_meta(roots: dict[str, nn.Module]) -> None:
    """Raises RuntimeError if any tensor of ``roots`` is left on the meta device (no value loaded into it)."""
    left = [f"{name}.{n}" for name, root in roots.items() for n, t in _tensors(root) if t.is_meta]
    if left:
        raise RuntimeError(f"no weights loaded into {left[:3]} ({len(left)} tensors) under fsdp2")


def _tensors(root: nn.Module):
    """``(name, tensor)`` of every parameter and buffer of ``root`` (each shared tensor once)."""
    yield from root.named_parameters()
    yield from root.named_buffers()


def _non_persistent(root: nn.Module):
    """``(name, buffer)`` of the buffers of ``root`` that its state dict leaves out."""
    for owner, sub in root.named_modules():
        for attr in sub._non_persistent_buffers_set:
            if sub._buffers.get(attr) is not None:
                yield (f"{owner}.{attr}" if owner else attr), sub._buffers[attr]
