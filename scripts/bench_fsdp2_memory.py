"""Peak host memory per process of loading a denoiser under FSDP2: 2 CPU processes against 1, in one run.

    OMP_NUM_THREADS=1 python scripts/bench_fsdp2_memory.py [--layers 12] [--heads 8] [--head-dim 64]

Saves a tiny-family model (``flowrl.policies.tiny_components``) with a wider, deeper SD3 transformer and random
weights to a temporary folder (the defaults: 111 M parameters, 424 MB in float32), then loads its policy with LoRA
(``TinyFlowPolicy``), each load in fresh processes:

- ``1 process``: ``policy.load()``, the whole model;
- ``FSDP2 x2, every rank reads``: what FSDP2 did before loading moved under the strategy: each of 2 gloo processes
  loads the whole model, then ``fully_shard`` splits it (:func:`flowrl.policies.sharding.shard_policy`);
- ``FSDP2 x2, own slices``: what ``fsdp2`` does now (:func:`flowrl.strategies.sharded_load.load_into_shards`):
  each rank builds the denoiser on the meta device, shards it, and reads its own rows of the safetensors file.

Each process reads every weight it holds once (as the first step will: the safetensors file is memory-mapped, its
pages resident only once read), then reports its peak resident memory (``VmHWM``, reset through
``/proc/self/clear_refs`` once the policy is built, so the imports and the config reading are the baseline) minus its
resident memory at that baseline, the bytes of denoiser it holds, and its file-backed resident memory at the end
(``RssFile``: mapped pages of the model files, which processes on one machine share through the page cache).
The script prints one row per process and the ratio of its peak to the 1-process load's. On a machine shared with
other jobs the figures are per process and do not depend on the others' load (the run time does).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

MB = 2 ** 20


def status_kb(field: str) -> int:
    """A ``/proc/self/status`` field in kB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def baseline() -> int:
    """Resident kB now, the peak reset to it (Linux's ``clear_refs`` 5), so ``VmHWM`` counts what follows."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_kb("VmRSS")


def save_model(out: Path, layers: int, heads: int, head_dim: int) -> int:
    """The tiny-family model with a bigger transformer (random weights) at ``out``; returns its parameter count."""
    from flowrl.policies.tiny_components import build_components, build_transformer, save_components

    torch.manual_seed(0)
    components = build_components(num_layers=1, text_layers=1)
    components["transformer"] = build_transformer(num_layers=layers, num_heads=heads, head_dim=head_dim)
    save_components(components, out)
    return sum(p.numel() for p in components["transformer"].parameters())


def measure(rank: int, world: int, mode: str, folder: str, port: int, results) -> None:
    """One process's load (``mode``: ``whole``, ``every rank reads`` or ``own slices``); puts
    ``(mode, rank, peak MB, denoiser MB held, file-backed MB)`` on ``results``."""
    from torch.distributed.tensor import DTensor

    from flowrl.policies.base import LoraOptions
    from flowrl.policies.sharding import shard_policy
    from flowrl.policies.tiny import TinyFlowPolicy
    from flowrl.strategies.sharded_load import load_into_shards

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    policy = TinyFlowPolicy(folder, lora=LoraOptions(rank=8))
    start = baseline()
    if mode == "own slices":
        from torch.distributed.device_mesh import init_device_mesh

        load_into_shards(policy, policy.load, init_device_mesh("cpu", (world,)))
    else:
        policy.load()
        if world > 1:
            from torch.distributed.device_mesh import init_device_mesh

            shard_policy(policy, init_device_mesh("cpu", (world,)))
    local = [p.to_local() if isinstance(p, DTensor) else p for p in policy.denoiser.parameters()]
    with torch.no_grad():  # read every weight once, as the first step will: safetensors' pages map in lazily
        sum(float(t.float().sum()) for t in local)
    results.put((mode, rank, (status_kb("VmHWM") - start) / 1024, sum(t.nbytes for t in local) / MB,
                 status_kb("RssFile") / 1024))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode: str, world: int, folder: str) -> list[tuple]:
    """``measure`` on ``world`` fresh processes; their results, by rank."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    torch.multiprocessing.start_processes(measure, args=(world, mode, folder, free_port(), results), nprocs=world,
                                          start_method="spawn")
    return sorted((results.get() for _ in range(world)), key=lambda r: r[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        count = save_model(Path(tmp), args.layers, args.heads, args.head_dim)
        print(f"denoiser: SD3Transformer2DModel, {args.layers} layers, width {args.heads * args.head_dim}, "
              f"{count / 1e6:.1f} M parameters, {count * 4 / MB:.0f} MB in float32 (LoRA rank 8)")
        rows = [*run("whole", 1, tmp), *run("every rank reads", 2, tmp), *run("own slices", 2, tmp)]
    one = rows[0][2]
    print(f"{'load':<28}{'rank':>5}{'peak MB':>10}{'held MB':>10}{'file MB':>10}{'peak / 1 process':>18}")
    for mode, rank, peak, held, file in rows:
        name = "1 process" if mode == "whole" else f"FSDP2 x2, {mode}"
        print(f"{name:<28}{rank:>5}{peak:>10.0f}{held:>10.0f}{file:>10.0f}{peak / one:>18.2f}")


if __name__ == "__main__":
    main()
