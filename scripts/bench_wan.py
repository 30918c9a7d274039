"""The Wan rows of ``bench_models.py``: the tiny Wan pipelines as the tests build them, the bare transformer calls
flowrl's Wan adapter wraps, and the memory of a training pass against the number of frames.

Memory: a CPU has no allocator peak counter, so the pass's peak above its weights is measured as what the backward
must keep, exactly: the bytes of every tensor the forward saves for the backward (``saved_tensors_hooks``; each
storage once, the model's weights excluded), which is what grows with frames. With gradient checkpointing only each
block's inputs are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

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


def wan_policy(path: str, frames: int = 9, size: int = 32, checkpointing: bool = False):
    from flowrl.policies import LoraOptions, WanPolicy

    return WanPolicy(path, lora=LoraOptions(rank=4, alpha=8.0), height=size, width=size, num_frames=frames,
                     max_sequence_length=16, gradient_checkpointing=checkpointing)


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


def saved_bytes(forward: Callable[[], Tensor], weights: Sequence[Tensor]) -> int:
    """Bytes of the tensors ``forward`` saves for its backward (each storage once), the ``weights`` excluded; runs
    the backward too, so the pass is a real training pass.

    >>> w = torch.ones(3, 3, requires_grad=True)
    >>> saved_bytes(lambda: (torch.ones(4, 3) @ w).square().sum(), [w])  # the input and the product: 2 x 48
    96
    """
    skip = {w.untyped_storage().data_ptr() for w in weights}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        if t.untyped_storage().data_ptr() not in skip:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    loss.backward()
    return sum(storages.values())


def training_memory(root: Path, frames: Sequence[int] = (1, 5, 9, 17), size: int = 64, pairs: int = 4,
                    guidance: float = 4.5) -> list[dict]:
    """Per frame count: the bytes one PPO micro-batch of ``pairs`` (sample, step) pairs keeps for its backward on the
    tiny Wan 2.1 (LoRA, CFG), without and with gradient checkpointing."""
    from flowrl.methods.flow_grpo import FlowGRPO

    path, rows = save_wan("wan21", root), []
    for count in frames:
        record = {"frames": count}
        for checkpointing in (False, True):
            torch.manual_seed(0)
            policy = wan_policy(path, count, size, checkpointing)
            method = FlowGRPO(policy, num_steps=4, guidance_scale=guidance, micro_batch_size=pairs)
            data = {"prompts": ["a red cat"] * pairs, "seeds": torch.arange(pairs), "group_ids": torch.zeros(pairs)}
            cond = policy.encode(data["prompts"])
            rollout = method.rollout(data, cond)
            chunk, ones = rollout.train_mask.nonzero()[:pairs], torch.ones_like(rollout.log_probs)
            policy.train()
            record["checkpointed" if checkpointing else "saved"] = saved_bytes(
                lambda: method.pair_loss(rollout, cond, ones, ones, chunk)[0], list(policy.parameters()))
            record["latent"] = tuple(policy.latent_shape())
        rows.append(record)
    return rows


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs``.

    >>> slope([1, 2, 3, 5], [10, 20, 30, 50])
    10.0
    """
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def memory_table(rows: list[dict]) -> str:
    """The frames table (KiB) with the slope per latent frame and each row's ratio to the one-frame pass."""
    lines = ["| frames | latents | saved for backward (KiB) | x 1 frame | with checkpointing (KiB) | x 1 frame |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['frames']} | {'x'.join(map(str, r['latent']))} | {r['saved'] / 1024:.1f} | "
                     f"{r['saved'] / rows[0]['saved']:.2f} | {r['checkpointed'] / 1024:.1f} | "
                     f"{r['checkpointed'] / rows[0]['checkpointed']:.2f} |")
    latent = [r["latent"][1] for r in rows]
    per = [slope(latent, [r[k] / 1024 for r in rows]) for k in ("saved", "checkpointed")]
    lines.append(f"\nslope: {per[0]:.1f} KiB per latent frame (4 video frames) without checkpointing, {per[1]:.1f} "
                 "KiB with it")
    return "\n".join(lines)


def frames_report(models: Sequence[str], root: Path, frames: Sequence[int], guidance: float) -> str:
    """The memory table under its heading when ``models`` include a Wan model, else ``""``."""
    if not any(name in WAN_MODELS for name in models):
        return ""
    table = memory_table(training_memory(root, frames, guidance=guidance))
    return f"\n\ntraining micro-batch of 4 (sample, step) pairs on the tiny Wan 2.1 at 64 px, by frames:\n{table}"
