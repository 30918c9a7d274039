"""FSDP2 on 2 CPU processes (gloo) loads the trained denoiser into each rank's shards, each rank reading only its own
rows of the safetensors file (:mod:`flowrl.strategies.sharded_load`): before the first step a rank's parameters are
exactly its slices of the model one process loads (LoRA's random initialisation included, and the random state after
it), the denoiser's ``from_pretrained`` ran on no rank (both build it on the meta device), and the rows a rank read of
each sharded weight are its own half."""

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from diffusers import SD3Transformer2DModel

from flowrl.policies.base import LoraOptions
from flowrl.policies.tiny import TinyFlowPolicy
from flowrl.strategies import sharded_load
from flowrl.strategies.safetensors_slices import read_rows
from flowrl.strategies.sharded_load import load_into_shards


def policy(folder: str, full: bool) -> TinyFlowPolicy:
    torch.manual_seed(0)  # as the CLI seeds every process alike before it builds the policy
    return TinyFlowPolicy(folder, lora=None if full else LoraOptions(rank=4))


def load_on_rank(rank: int, folder: str, port: int, full: bool, out: str) -> None:
    """One rank: the 1-process load, then the sharded one; what a test compares goes to ``out/rank<r>.pt``."""
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    whole = policy(folder, full).load()
    whole_rng = torch.get_rng_state()
    calls = []
    pretrained = SD3Transformer2DModel.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        calls.append(kwargs.get("subfolder"))
        return pretrained(cls, *args, **kwargs)

    reads = []

    def recorded(handle, name, start, stop, dtype):
        reads.append((name, start, stop))
        return read_rows(handle, name, start, stop, dtype)

    SD3Transformer2DModel.from_pretrained = classmethod(counted)
    sharded_load.read_rows = recorded
    try:
        sharded = policy(folder, full)
        load_into_shards(sharded, sharded.load, init_device_mesh("cpu", (2,)))
    finally:
        del SD3Transformer2DModel.from_pretrained
        sharded_load.read_rows = read_rows
    got = sharded.denoiser.state_dict()
    expected = {n: slice_of(t.detach(), rank) if hasattr(got[n], "to_local") else t
                for n, t in whole.denoiser.state_dict().items()}
    got = {n: t.to_local().detach() if hasattr(t, "to_local") else t for n, t in got.items()}
    rows = {n: len(t) for n, t in whole.denoiser.state_dict().items() if t.dim()}
    torch.save({"calls": calls, "reads": reads, "rows": rows, "expected": expected, "got": got,
                "buffers": dict(sharded.denoiser.named_buffers()),
                "whole_buffers": dict(whole.denoiser.named_buffers()), "rng": torch.equal(torch.get_rng_state(),
                                                                                         whole_rng),
                "trainable": sorted(n for n, p in sharded.denoiser.named_parameters() if p.requires_grad),
                "whole_trainable": sorted(n for n, p in whole.denoiser.named_parameters() if p.requires_grad)},
               Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def slice_of(tensor: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s FSDP2 shard of ``tensor`` (of 2): its ``torch.chunk`` along dim 0, empty past the last."""
    chunks = tensor.chunk(2)
    return chunks[rank] if rank < len(chunks) else tensor[:0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["lora", "full"])
def test_each_rank_holds_exactly_its_slices_read_from_the_file_by_itself(tiny_model_dir, tmp_path, full):
    # forked, not spawned: each rank starts with the imports this process made (a spawned rank pays ~10 CPU-s of them)
    torch.multiprocessing.start_processes(load_on_rank, args=(tiny_model_dir, free_port(), full, str(tmp_path)),
                                          nprocs=2, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["calls"] for r in ranks] == [[], []]  # no rank loaded the whole denoiser
    for rank, r in enumerate(ranks):
        # a sharded weight of n rows: rank 0 reads rows [0, ceil(n/2)), rank 1 the rest (torch.chunk's split); a
        # buffer FSDP2 leaves whole (the positional embedding), all of it on both
        sharded = [(name, start, stop) for name, start, stop in r["reads"] if name != "pos_embed.pos_embed"]
        assert len(sharded) > 10 and all((start, stop) == ((0, -(-r["rows"][n] // 2)) if rank == 0 else
                                                           (-(-r["rows"][n] // 2), r["rows"][n]))
                                         for n, start, stop in sharded if n in r["rows"]), sharded[:3]
        assert r["expected"].keys() == r["got"].keys() and len(r["got"]) > 10
        wrong = [n for n in r["expected"] if not torch.equal(r["expected"][n], r["got"][n])]
        assert not wrong, wrong[:3]  # bit-identical, LoRA's random initialisation included
        assert r["buffers"].keys() == r["whole_buffers"].keys()
        assert all(torch.equal(b, r["whole_buffers"][n]) and b.dtype == r["whole_buffers"][n].dtype
                   for n, b in r["buffers"].items())
        assert all(r["expected"][n].dtype == r["got"][n].dtype for n in r["got"])
        assert r["rng"]  # the random state after the load is the 1-process load's
        assert r["trainable"] == r["whole_trainable"] and r["trainable"]
