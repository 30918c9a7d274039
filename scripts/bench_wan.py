"""The Wan rows of ``bench_models.py``: the tiny Wan pipelines as the tests build them and the bare transformer calls
flowrl's Wan adapter wraps (the memory of a training pass against frames: ``bench_video_memory.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

WAN_MODELS = ("wan21", "wan22")


def save_wan(name: str, root: Path) -> str:
    """The tiny ``wan21`` or ``wan22`` (two experts, UniPC) pipeline of the tests, saved under ``root``."""
    from diffusers import WanPipeline

    from tests.policies.tiny_wan import save, wan21, wan22

    path = root / name
    if not (path / "model_index.json").is_file():
        save(WanPipeline, wan21 if name == "wan21" else wan22, path)
    return str(path)


def wan_policy(path: str, frames: int = 9, size: int = 32, checkpointing: bool = False, offload: bool = False):
    from flowrl.policies import LoraOptions, WanPolicy

    return WanPolicy(path, lora=LoraOptions(rank=4, alpha=8.0), height=size, width=size, num_frames=frames,
                     max_sequence_length=16, gradient_checkpointing=checkpointing, activation_offload=offload).load()


def wan_model(name: str, root: Path) -> tuple:
    """``bench_models.build_policy``'s row for ``wan21`` / ``wan22``: the adapter, its bare calls, step kind, level."""
    return wan_policy(save_wan(name, root)), wan_transformer, "flow_grpo", 0.7


def wan_transformer(policy, cond, sigmas: Tensor, guidance: float):
    """Wan as ``WanPipeline`` calls it: each expert on the rows whose step's timestep falls on it, the conditional and
    unconditional rows as one batch, the expert's guidance scale, an Euler update."""
    from scripts.bench_models import Bare, euler

    experts, boundary = policy.denoiser.experts(), policy.denoiser.boundary_timestep
    timesteps, n = policy.timesteps(sigmas[:-1]), len(cond.embeds)
    embeds, scales = torch.cat([cond.null_embeds, cond.embeds]), (guidance, policy.guidance_scale_2 or guidance)

    def output(z, k, rows):
        t = timesteps[k]
        which = (t < boundary).long() if boundary is not None else torch.zeros_like(k)
        out = torch.empty_like(z)
        for e, module in enumerate(experts):
            sel = (which == e).nonzero().flatten()
            if len(sel):
                both = torch.cat([rows[sel], rows[sel] + n])
                v_u, v_c = module(hidden_states=torch.cat([z[sel], z[sel]]), timestep=t[sel].repeat(2),
                                  encoder_hidden_states=embeds[both], return_dict=False)[0].chunk(2)
                out[sel] = v_u + scales[e] * (v_c - v_u)
        return out

    return Bare(output, euler(sigmas))
