"""Activation memory per process of context parallelism on the tiny Wan 2.1, measured against 1 process: what one
training pass (one sample with CFG, a Flow-GRPO step's log-prob, its backward) keeps for its backward when 2 CPU
processes split the clip's tokens (Ulysses attention over gloo, :mod:`flowrl.strategies.context_parallel`), by the
clip's frames, plain and with gradient checkpointing.

    OMP_NUM_THREADS=1 python scripts/bench_context_parallel.py [--frames 9 17 33 65] [--size 64]

A CPU has no allocator peak counter, so the pass's memory above its weights is counted exactly as the bytes of the
tensors its forward saves for the backward (``bench_video_memory.saved_bytes``: each storage once, the weights
excluded). Each process measures both passes in one run: first as one process (the whole clip, before anything is
split), then with the clip split between the two. The weights are not sharded here (FSDP2 would add each block's
gathered weights to what a pass saves, the same with or without the split), so the ratio is the split's alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' pipeline builders

from scripts.bench_video_memory import saved_bytes  # noqa: E402
from scripts.bench_wan import save_wan, wan_policy  # noqa: E402


def one_pass(policy, guidance: float = 4.5):
    """A training pass's forward on one clip: the guided velocity and a Flow-GRPO step's log-prob of a recorded next
    latent; returns its loss (``saved_bytes`` runs the backward)."""
    from flowrl.sampling.steps import flow_grpo_step

    generator = torch.Generator().manual_seed(0)
    z = torch.randn(1, *policy.latent_shape(), generator=generator)
    z_next = z + 0.1 * torch.randn(z.shape, generator=generator)
    sigmas = policy.sigmas(4)
    cond = policy.encode(["a red ball rolls"])
    v = policy.velocity(z, sigmas[1:2], cond, guidance)
    return flow_grpo_step(z, v, sigmas[1:2], sigmas[2:3], z_next=z_next).log_prob.sum()


def measure_rank(rank: int, path: str, port: int, frames: list[int], size: int, out: str) -> None:
    """Process ``rank`` of 2: for each frame count and checkpointing setting, the pass's saved bytes as one process,
    then with the clip split; written to ``out/rank<r>.pt``."""
    from flowrl.policies.context_parallel import enable_context_parallel
    from flowrl.strategies.context_parallel import context_parallel_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = context_parallel_mesh("cpu", 2, 2, "ulysses")
    rows = []
    for n in frames:
        for checkpointing in (False, True):
            torch.manual_seed(0)
            policy = wan_policy(path, n, size, checkpointing=checkpointing)
            weights = list(policy.parameters())
            whole = saved_bytes(lambda: one_pass(policy), weights)
            enable_context_parallel(policy, mesh)
            split = saved_bytes(lambda: one_pass(policy), weights)
            rows.append({"frames": n, "checkpointing": checkpointing, "latents": tuple(policy.latent_shape()),
                         "whole": whole, "split": split})
    torch.save(rows, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def table(ranks: list[list[dict]]) -> str:
    """The markdown table of both ranks' rows: KiB as one process, per process split, and their ratio."""
    lines = ["| frames | latents | tokens | checkpointing | 1 process (KiB) | per process of 2 (KiB) | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for mine, other in zip(*ranks):
        c, f, h, w = mine["latents"]
        split = max(mine["split"], other["split"])  # the larger of the two processes' (they are equal here)
        lines.append(f"| {mine['frames']} | {c}x{f}x{h}x{w} | {f * (h // 2) * (w // 2)} | "
                     f"{'on' if mine['checkpointing'] else 'off'} | {mine['whole'] / 1024:.1f} | "
                     f"{split / 1024:.1f} | {split / mine['whole']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[9, 17, 33, 65])
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    from tests.policies.test_fsdp2_sharded_load import free_port

    with tempfile.TemporaryDirectory() as root:
        path = save_wan("wan21", Path(root))
        torch.multiprocessing.spawn(measure_rank, args=(path, free_port(), args.frames, args.size, root), nprocs=2)
        ranks = [torch.load(Path(root) / f"rank{r}.pt") for r in (0, 1)]
    print(table(ranks))


if __name__ == "__main__":
    main()
