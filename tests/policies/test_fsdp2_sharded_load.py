"""FSDP2 on 2 CPU processes (gloo) loads the trained denoiser into each rank's shards from rank zero alone
(:mod:`flowrl.strategies.sharded_load`): before the first step a rank's parameters are exactly its slices of the model
one process loads (LoRA's random initialisation included, and the random state after it), and the denoiser's
``from_pretrained`` ran on rank zero only, rank one building it on the meta device."""

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from diffusers import SD3Transformer2DModel

from flowrl.policies.base import LoraOptions
from flowrl.policies.tiny import TinyFlowPolicy
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

    SD3Transformer2DModel.from_pretrained = classmethod(counted)
    try:
        sharded = policy(folder, full)
        load_into_shards(sharded, sharded.load, init_device_mesh("cpu", (2,)))
    finally:
        del SD3Transformer2DModel.from_pretrained
    got = sharded.denoiser.state_dict()
    expected = {n: slice_of(t.detach(), rank) if hasattr(got[n], "to_local") else t
                for n, t in whole.denoiser.state_dict().items()}
    got = {n: t.to_local().detach() if hasattr(t, "to_local") else t for n, t in got.items()}
    torch.save({"calls": calls, "expected": expected, "got": got, "buffers": dict(sharded.denoiser.named_buffers()),
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
def test_each_rank_holds_exactly_its_slices_read_by_rank_zero_alone(tiny_model_dir, tmp_path, full):
    torch.multiprocessing.spawn(load_on_rank, args=(tiny_model_dir, free_port(), full, str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["calls"] for r in ranks] == [["transformer"], []]  # rank one never read the denoiser's weights
    for r in ranks:
        assert r["expected"].keys() == r["got"].keys() and len(r["got"]) > 10
        wrong = [n for n in r["expected"] if not torch.equal(r["expected"][n], r["got"][n])]
        assert not wrong, wrong[:3]  # bit-identical, LoRA's random initialisation included
        assert r["buffers"].keys() == r["whole_buffers"].keys()
        assert all(torch.equal(b, r["whole_buffers"][n]) for n, b in r["buffers"].items())
        assert r["rng"]  # the random state after the load is the 1-process load's
        assert r["trainable"] == r["whole_trainable"] and r["trainable"]
