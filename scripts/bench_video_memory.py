"""Memory of video training on the tiny Wan 2.1, measured: what a training micro-batch keeps for its backward against
the video's frames and its resolution (plain, with gradient checkpointing, with activation offload), and what a tree
rollout stores against its branch count; and why the training pass does not chunk frames.

    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py [--frames 1 5 9 17] [--sizes 32 64 128]
        [--branches 2 3 4 6]

A CPU has no allocator peak counter, so a pass's peak above its weights is measured as what its backward must keep,
exactly: the bytes of every tensor the forward saves for the backward (``saved_tensors_hooks``; each storage once,
the model's weights excluded), which is what grows with frames and resolution. With gradient checkpointing only each
block's inputs are kept. With activation offload the denoiser's saved tensors go to the host: ``kept`` is what the
pass still keeps beside the weights (the tensors saved outside the denoiser: the guidance's combination, the SDE
step's log-prob), ``copied`` the bytes the offload hooks copied to the host (each way, per pass). On a CPU the
copies stay in the same memory; on an accelerator ``kept`` is what stays on it.

Trees: TempFlow-GRPO (``branches`` children at each branch step, completed by the ODE) and Dynamic-TreeRPO
(``branches`` children per node at each of a 2-step window's steps) on the tiny Wan 2.1, 10 steps: per prompt the
leaves (rollout rows), the states the rollout stores (``node_latents``: a shared prefix once), the states a dense
``[leaves, T+1]`` buffer would hold, stored / distinct states, and the widest model call (nodes per prompt, before
CFG doubles it).

Chunking: the velocity of a clip computed a few latent frames at a time against the whole clip at once (Wan's
self-attention spans every frame, so a chunk is another function), and one sample at a time (the same function).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' pipeline builders

from scripts.bench_wan import WAN_MODELS, save_wan, wan_policy  # noqa: E402

#: Wan 2.1's latent state at 480 x 832 x 33 frames (16 channels, 9 latent frames of 60 x 104), float32, for the
#: trees table's bytes column (a state's size does not change how many a tree stores)
STATE_480P_33 = 16 * 9 * 60 * 104 * 4


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


def pass_memory(path: str, frames: int, size: int, pairs: int = 4, guidance: float = 4.5) -> dict:
    """What one PPO micro-batch of ``pairs`` (sample, step) pairs keeps for its backward on the tiny Wan 2.1 (LoRA,
    CFG) at ``frames`` frames of ``size`` px: ``saved``, ``checkpointed``, with activation offload ``kept`` and
    ``copied`` (bytes), the ``latent`` shape and the transformer's ``tokens`` per sample."""
    from flowrl.methods.flow_grpo import FlowGRPO

    record = {"frames": frames, "size": size}
    for key, options in (("saved", {}), ("checkpointed", {"checkpointing": True}), ("kept", {"offload": True})):
        torch.manual_seed(0)
        policy = wan_policy(path, frames, size, **options)
        method = FlowGRPO(policy, num_steps=4, guidance_scale=guidance, micro_batch_size=pairs)
        data = {"prompts": ["a red cat"] * pairs, "seeds": torch.arange(pairs), "group_ids": torch.zeros(pairs)}
        cond = policy.encode(data["prompts"])
        rollout = method.rollout(data, cond)
        chunk, ones = rollout.train_mask.nonzero()[:pairs], torch.ones_like(rollout.log_probs)
        policy.train()
        record[key] = saved_bytes(lambda: method.pair_loss(rollout, cond, ones, ones, chunk)[0],
                                  list(policy.parameters()))
        if options.get("offload"):
            record["copied"] = policy.offload.stored_bytes  # the rollout ran without autograd: nothing before
    _, f, h, w = record["latent"] = tuple(policy.latent_shape())
    _, p_h, p_w = policy.denoiser.config.patch_size
    record["tokens"] = f * (h // p_h) * (w // p_w)
    return record


def training_memory(root: Path, frames: Sequence[int] = (1, 5, 9, 17), size: int = 64, pairs: int = 4,
                    guidance: float = 4.5) -> list[dict]:
    """:func:`pass_memory` per frame count at ``size`` px."""
    path = save_wan("wan21", root)
    return [pass_memory(path, count, size, pairs, guidance) for count in frames]


def resolution_memory(root: Path, sizes: Sequence[int] = (32, 64, 128), frames: int = 5, pairs: int = 4,
                      guidance: float = 4.5) -> list[dict]:
    """:func:`pass_memory` per frame size (square, px) at ``frames`` frames."""
    path = save_wan("wan21", root)
    return [pass_memory(path, frames, size, pairs, guidance) for size in sizes]


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs``.

    >>> slope([1, 2, 3, 5], [10, 20, 30, 50])
    10.0
    """
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def memory_table(rows: list[dict], by: str = "frames") -> str:
    """The table (KiB) of :func:`training_memory` (``by="frames"``) or :func:`resolution_memory` (``by="size"``),
    each row's ratio to the first, and the slope per latent frame or per token."""
    kib = lambda r, key: r[key] / 1024  # noqa: E731
    lines = [f"| {by} | latents | tokens | saved for backward (KiB) | x first | with checkpointing (KiB) | x first | "
             "with offload: kept (KiB) | with offload: copied to host (KiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r[by]} | {'x'.join(map(str, r['latent']))} | {r['tokens']} | {kib(r, 'saved'):.1f} | "
                     f"{r['saved'] / rows[0]['saved']:.2f} | {kib(r, 'checkpointed'):.1f} | "
                     f"{r['checkpointed'] / rows[0]['checkpointed']:.2f} | {kib(r, 'kept'):.1f} | "
                     f"{kib(r, 'copied'):.1f} |")
    unit, xs = ("latent frame (4 video frames)", [r["latent"][1] for r in rows]) if by == "frames" else \
        ("token", [r["tokens"] for r in rows])
    per = [slope(xs, [kib(r, key) for r in rows]) for key in ("saved", "checkpointed", "kept")]
    lines.append(f"\nslope: {per[0]:.2f} KiB per {unit} without checkpointing, {per[1]:.2f} KiB with it, "
                 f"{per[2]:.2f} KiB kept with activation offload")
    return "\n".join(lines)


def tree_storage(root: Path, branches: Sequence[int] = (2, 3, 4, 6), steps: int = 10) -> list[dict]:
    """Per tree method and branch count: per prompt its ``leaves``, ``stored`` states, ``distinct`` states,
    ``dense`` states (``leaves x (T + 1)``) and ``widest`` model call (nodes), on the tiny Wan 2.1 at 32 px x 9."""
    from flowrl.methods import TempFlowGRPO, TreeRPO

    policy = wan_policy(save_wan("wan21", root))
    batch = {"prompts": ["a red cat", "a blue dog"], "group_ids": torch.arange(2), "seeds": torch.tensor([7, 8])}
    cond, prompts, rows = policy.encode(batch["prompts"]), len(batch["seeds"]), []
    for name, make in (("TempFlow-GRPO", lambda k: TempFlowGRPO(policy, num_steps=steps, branches=k)),
                       ("Dynamic-TreeRPO", lambda k: TreeRPO(policy, num_steps=steps, window_size=2, window_start=1,
                                                             branches=k))):
        for k in branches:
            method = make(k)
            method.trainer = type("Trainer", (), {"global_step": 0})()  # TreeRPO's window position
            widths, forward = [], policy._forward
            policy._forward = lambda z, *args: widths.append(len(z)) or forward(z, *args)
            try:
                with torch.no_grad():
                    rollout = method.rollout(batch, cond)
            finally:
                del policy._forward
            stored = rollout.node_latents
            distinct = torch.unique(stored.flatten(1), dim=0).shape[0]
            rows.append({"method": name, "branches": k, "leaves": rollout.batch_size / prompts,
                         "stored": len(stored) / prompts, "distinct": distinct / prompts,
                         "dense": rollout.batch_size * (rollout.num_steps + 1) / prompts,
                         "widest": max(widths) / prompts / (2 if method.guidance_scale > 1 else 1)})
    return rows


def tree_table(rows: list[dict]) -> str:
    lines = ["| method | branches | leaves per prompt | states stored | states of a dense buffer | stored / distinct | "
             "widest model call (nodes) | stored at 480x832 x 33 frames (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['branches']} | {r['leaves']:.0f} | {r['stored']:.0f} | {r['dense']:.0f} "
                     f"| {r['stored'] / r['distinct']:.3f} | {r['widest']:.0f} | "
                     f"{r['stored'] * STATE_480P_33 / 2 ** 20:.0f} |")
    return "\n".join(lines)


def chunking_change(root: Path, frames: int = 17, chunks: Sequence[int] = (1, 2), guidance: float = 4.0) -> list[dict]:
    """How far the guided velocity of the tiny Wan 2.1 (``frames`` frames of 32 px, two samples at two steps) moves
    when the transformer runs on chunks of ``chunks`` latent frames, or on one row at a time: per chunking the largest
    change of a frame over the velocity's largest magnitude (``frame_max``, the first frame's ``first``) and the
    relative norm of the change (``norm``)."""
    policy = wan_policy(save_wan("wan21", root), frames)
    torch.manual_seed(0)
    cond, sigma = policy.encode(["a red cat", "a blue dog"]), policy.sigmas(4)[[1, 2]]
    z = torch.randn(2, *policy.latent_shape())

    def v(x: Tensor, rows: Sequence[int] = (0, 1)) -> Tensor:
        return policy.velocity(x, sigma[list(rows)], cond.select(rows), guidance)

    rows = []
    with torch.no_grad():
        full = v(z)
        chunked = {f"{k} latent frame{'s' * (k > 1)}": torch.cat([v(part) for part in z.split(k, dim=2)], 2)
                   for k in chunks}
        chunked["1 row (sample)"] = torch.cat([v(z[i:i + 1], (i,)) for i in range(len(z))])
    for name, out in chunked.items():
        per_frame = (out - full).abs().amax(dim=(0, 1, 3, 4)) / full.abs().max()
        rows.append({"chunk": name, "frame_max": per_frame.max().item(), "first": per_frame[0].item(),
                     "norm": ((out - full).norm() / full.norm()).item()})
    return rows


def chunking_table(rows: list[dict]) -> str:
    lines = ["| transformer run on chunks of | largest change of a frame / largest velocity | first frame's | "
             "relative change (norm) |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['chunk']} | {r['frame_max']:.2e} | {r['first']:.2e} | {r['norm']:.2e} |" for r in rows]
    return "\n".join(lines)


def frames_report(models: Sequence[str], root: Path, frames: Sequence[int], guidance: float) -> str:
    """``bench_models.py``'s frames table under its heading when ``models`` include a Wan model, else ``""``."""
    if not any(name in WAN_MODELS for name in models):
        return ""
    table = memory_table(training_memory(root, frames, guidance=guidance))
    return f"\n\ntraining micro-batch of 4 (sample, step) pairs on the tiny Wan 2.1 at 64 px, by frames:\n{table}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 5, 9, 17], help="video frames (at 64 px)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128], help="frame sizes in px (5 frames)")
    parser.add_argument("--branches", type=int, nargs="+", default=[2, 3, 4, 6], help="tree branch counts")
    args = parser.parse_args(argv)
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}")
        print("\ntraining micro-batch of 4 (sample, step) pairs, CFG, LoRA, at 64 px, by frames:")
        print(memory_table(training_memory(root, args.frames)))
        print("\nthe same at 5 frames, by frame size:")
        print(memory_table(resolution_memory(root, args.sizes), by="size"))
        print("\ntree rollouts, T=10, by branch count:")
        print(tree_table(tree_storage(root, args.branches)))
        print("\nthe velocity of 17 frames (5 latent frames) computed in chunks, against the whole clip at once:")
        print(chunking_table(chunking_change(root)))


if __name__ == "__main__":
    main()
