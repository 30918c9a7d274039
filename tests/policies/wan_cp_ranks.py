"""What one process of the context-parallel tests computes (spawned by ``tests/policies/test_wan_context_parallel.py``):
the tiny Wan 2.1 policy's guided velocity, Flow-GRPO step log-probabilities and LoRA gradients for one clip, first as
one process does (the whole model, no collective), then with its weights sharded by FSDP2 over both processes and the
clip's tokens split between them by diffusers' context parallelism (:mod:`flowrl.strategies.context_parallel`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from flowrl.policies import LoraOptions, WanPolicy
from flowrl.sampling.steps import flow_grpo_step
from flowrl.strategies.context_parallel import context_parallel_mesh, sharding_mesh, split_for_strategy
from tests.policies.tiny_wan import FRAMES, SIZE

GUIDANCE = 4.0


def policy(folder: str, autocast: Optional[str] = None) -> WanPolicy:
    torch.manual_seed(0)  # every process builds the same LoRA, as the CLI seeds them alike
    return WanPolicy(folder, lora=LoraOptions(rank=4, alpha=8), height=SIZE, width=SIZE, num_frames=FRAMES,
                     max_sequence_length=16, autocast=autocast).load()


def clip_pass(wan: WanPolicy) -> dict:
    """One training pass over one clip: velocity ``[1, C, f, h, w]``, log-probs of a Flow-GRPO step ``[1]`` and the
    LoRA gradients of their sum (gathered whole from FSDP2's shards)."""
    generator = torch.Generator().manual_seed(7)
    z = torch.randn(1, *wan.latent_shape(), generator=generator)
    z_next = z + 0.1 * torch.randn(z.shape, generator=generator)  # a recorded next latent, as the PPO update reads
    device = next(wan.denoiser.parameters()).device
    z, z_next = z.to(device), z_next.to(device)
    sigmas = wan.sigmas(4)
    sigma, sigma_next = sigmas[1:2].to(device), sigmas[2:3].to(device)
    cond = wan.encode(["a red ball rolls"])
    v = wan.velocity(z, sigma, cond, GUIDANCE)
    step = flow_grpo_step(z, v, sigma, sigma_next, z_next=z_next)
    step.log_prob.sum().backward()
    grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
             for n, p in wan.denoiser.named_parameters() if p.requires_grad}
    return {"velocity": v.detach(), "log_prob": step.log_prob.detach(), "grads": grads}


def run_rank(rank: int, folder: str, port: int, out: str, attention: str, backend: Optional[str]) -> None:
    """Process ``rank`` of 2: the 1-process pass, then the context-parallel one; both go to ``out/rank<r>.pt``."""
    from torch.distributed.fsdp import FSDPModule

    from flowrl.policies.sharding import shard_policy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = "cuda" if backend else "cpu"
    dist.init_process_group("nccl" if backend else "gloo", rank=rank, world_size=2)
    if backend:
        torch.cuda.set_device(rank)
    # a GPU's ring backends (cuDNN, flash) take bf16 / fp16 only: both passes then run under bf16 autocast
    wan = policy(folder, "bfloat16" if backend else None).to(device)
    one = clip_pass(wan)
    wan.denoiser.zero_grad(set_to_none=True)
    mesh = context_parallel_mesh(device, 2, 2, attention)
    shard_policy(wan, sharding_mesh(mesh))
    models = split_for_strategy(wan, mesh, backend)
    split = clip_pass(wan)
    divide = [m._get_fsdp_state()._fsdp_param_groups[0].gradient_divide_factor for m in wan.modules()
              if isinstance(m, FSDPModule) and m._get_fsdp_state()._fsdp_param_groups]
    torch.save({"one": one, "split": split, "models": len(models), "divide": divide,
                "tokens": wan.denoiser.transformer._parallel_config.context_parallel_config._world_size},
               Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()
