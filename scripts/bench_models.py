"""Per-adapter overhead of flowrl against the bare model calls it wraps, and the memory of its trajectory buffer.

    OMP_NUM_THREADS=1 python scripts/bench_models.py [--models tiny sd3 flux sd15 qwen_image flux2 zimage qwen_edit
        kontext wan21 wan22] [--batch 8] [--steps 10] [--repeats 5] [--frames 1 5 9 17] [--cfg-gradient cond]

For each policy adapter at tiny size (the embedded ``flowrl/tiny-digits``; random-weight pipelines built as the tests
build them, saved to a temporary folder and loaded through the adapter's ``from_pretrained`` path), side by side in
one process with the calls interleaved (as ``bench_overhead.py``):

- rollout: ``FlowGRPO.rollout`` (seeded per-sample noise, the SDE step, log-probs, every state recorded) against a
  bare loop of the denoiser calls: the CFG batch with an Euler update (tiny, SD3), the transformer on packed latents
  with embedded guidance and no CFG batch (FLUX, as ``FluxPipeline``), the UNet's CFG epsilon with the DDIM update
  (SD1.5), the new families' transformers as their pipelines call them (``bench_family_calls.py``: packed
  latents, masks and the norm rescale for Qwen-Image, tokens and position ids for FLUX.2, lists of latents and
  unpadded captions at reversed time for Z-Image), the editing families' transformers on the noisy and source
  tokens (``bench_edit_calls.py``), each Wan expert on its rows' steps with CFG (``bench_wan.py``);
- training: ``PPOUpdate.pair_loss`` forward+backward over every trained (sample, step) pair in micro-batches against
  a bare forward+backward of the same micro-batches (mean-square loss on the guided output, the CFG pair as one
  batch); flowrl's pass follows ``--cfg-gradient`` (FlowGRPO's default ``cond``: the unconditional half in a
  no-graph call of its own, one more call per micro-batch than the bare pass and no backward through that half);
- memory: bytes of the ``Rollout`` tensors (each storage counted once, at its full size) against the ``B x (T+1) x
  latent numel x 4`` bytes of float32 latents the buffer must hold (target <= 1.2x); with a Wan model, what a
  training micro-batch keeps for its backward against the video's frames (``bench_video_memory.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' pipeline builders

from flowrl.methods.flow_grpo import FlowGRPO  # noqa: E402
from flowrl.policies import LoraOptions  # noqa: E402
from flowrl.policies.base import FlowPolicy  # noqa: E402
from scripts.bench_buffer import buffer_bytes, latent_bytes  # noqa: E402
from scripts.bench_overhead import timed  # noqa: E402
from scripts.bench_video_memory import frames_report  # noqa: E402
from scripts.bench_wan import wan_model  # noqa: E402

MODELS = ("tiny", "sd3", "flux", "sd15", "qwen_image", "flux2", "zimage", "qwen_edit", "kontext", "wan21", "wan22")


@dataclass
class Bare:
    """The bare model calls of one adapter.

    ``output(z, k, rows)``: the guided model output for latents ``z [N, ...]`` (in the bare call's own layout) at
    step indices ``k [N]`` of prompt rows ``rows [N]``; ``update(z, out, k)``: the deterministic sampler update
    from step ``k`` (an int); ``layout``: flowrl's ``[N, C, h, w]`` latents in the bare layout (applied outside the
    timed region).
    """

    output: Callable[[Tensor, Tensor, Tensor], Tensor]
    update: Callable[[Tensor, Tensor, int], Tensor]
    layout: Callable[[Tensor], Tensor] = lambda z: z


def euler(sigmas: Tensor) -> Callable[[Tensor, Tensor, int], Tensor]:
    return lambda z, v, k: z + (sigmas[k + 1] - sigmas[k]) * v


def cfg_transformer(policy: FlowPolicy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """SD3-family transformer (tiny, SD3): the unconditional and conditional rows as one batch, Euler update."""
    embeds, pooled = torch.cat([cond.null_embeds, cond.embeds]), torch.cat([cond.null_pooled, cond.pooled])
    n, scale = len(cond.embeds), policy.scheduler.config.num_train_timesteps

    def output(z, k, rows):
        both = torch.cat([rows, rows + n])
        out = policy.denoiser(hidden_states=torch.cat([z, z]), encoder_hidden_states=embeds[both],
                              pooled_projections=pooled[both], timestep=(sigmas[k] * scale).repeat(2),
                              return_dict=False)[0]
        v_u, v_c = out.chunk(2)
        return v_u + guidance * (v_c - v_u)

    return Bare(output, euler(sigmas))


def flux_transformer(policy: FlowPolicy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """FLUX.1 as ``FluxPipeline`` runs it: packed latents throughout, embedded guidance, no CFG batch."""
    from diffusers import FluxPipeline

    c, h, w = policy.latent_shape()
    image_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    text_ids = torch.zeros(cond.embeds.shape[1], 3)

    def output(z, k, rows):
        g = torch.full((len(z),), float(guidance))
        return policy.denoiser(hidden_states=z, timestep=sigmas[k], guidance=g, pooled_projections=cond.pooled[rows],
                               encoder_hidden_states=cond.embeds[rows], txt_ids=text_ids, img_ids=image_ids,
                               return_dict=False)[0]

    layout = lambda z: FluxPipeline._pack_latents(z, len(z), c, h, w)  # noqa: E731
    return Bare(output, euler(sigmas), layout)


def ddim_unet(policy: FlowPolicy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """SD1.5's UNet: CFG epsilon at the scheduler's integer timesteps, the DDIM (eta 0) update from its alphas."""
    scheduler, n = policy.scheduler, len(cond.embeds)
    scheduler.set_timesteps(len(sigmas) - 1)
    timesteps = scheduler.timesteps.long()
    alphas = torch.cat([scheduler.alphas_cumprod[timesteps], torch.as_tensor(scheduler.final_alpha_cumprod)[None]])
    embeds = torch.cat([cond.null_embeds, cond.embeds])

    def output(z, k, rows):
        both = torch.cat([rows, rows + n])
        out = policy.denoiser(torch.cat([z, z]), timesteps[k].repeat(2), encoder_hidden_states=embeds[both],
                              return_dict=False)[0]
        e_u, e_c = out.chunk(2)
        return e_u + guidance * (e_c - e_u)

    def update(z, eps, k):
        a, a_next = alphas[k], alphas[k + 1]
        x0 = (z - (1 - a).sqrt() * eps) / a.sqrt()
        return a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps

    return Bare(output, update)


def build_policy(name: str, root: Path) -> tuple[FlowPolicy, Callable, str, float]:
    """The adapter loaded through its ``from_pretrained`` path, its bare-call builder, step kind and noise level."""
    lora = LoraOptions(rank=4, alpha=8.0)
    if name == "tiny":
        from flowrl.policies import TinyFlowPolicy

        return TinyFlowPolicy("flowrl/tiny-digits", lora=lora).load(), cfg_transformer, "flow_grpo", 0.7
    from tests.policies.tiny_pipelines import flux_components, save_pipeline, sd3_components

    if name == "sd3":
        from diffusers import StableDiffusion3Pipeline

        from flowrl.policies import SD3Policy

        path = save_pipeline(StableDiffusion3Pipeline, sd3_components, root / "sd3")
        policy = SD3Policy(str(path), lora=lora, resolution=32, max_sequence_length=8).load()
        return policy, cfg_transformer, "flow_grpo", 0.7
    if name == "flux":
        from diffusers import FluxPipeline

        from flowrl.policies import FluxPolicy

        path = save_pipeline(FluxPipeline, flux_components, root / "flux")
        policy = FluxPolicy(str(path), lora=lora, resolution=32, max_sequence_length=8).load()
        return policy, flux_transformer, "flow_grpo", 0.7
    if name in ("qwen_image", "flux2", "zimage", "qwen_edit", "kontext"):
        from scripts.bench_edit_calls import EDIT_MODELS, edit_model

        return (*(edit_model if name in EDIT_MODELS else new_family)(name, root, lora), "flow_grpo", 0.7)
    if name == "sd15":
        from flowrl.policies import SD15Policy
        from tests.policies.tiny_sd15 import save_sd15

        path = save_sd15(root / "sd15")
        return SD15Policy(str(path), lora=lora, resolution=32).load(), ddim_unet, "ddim", 1.0
    if name.startswith("wan"):
        return wan_model(name, root)
    raise ValueError(f"unknown model {name!r}: choose from {', '.join(MODELS)}")


def new_family(name: str, root: Path, lora: LoraOptions) -> tuple[FlowPolicy, Callable]:
    """A Qwen-Image, FLUX.2 [klein] base or Z-Image adapter on its tiny pipeline, and its bare-call builder."""
    from diffusers import Flux2KleinPipeline, QwenImagePipeline, ZImagePipeline

    from flowrl.policies import Flux2Policy, QwenImagePolicy, ZImagePolicy
    from scripts import bench_family_calls as bare
    from tests.policies import tiny_families as tiny
    from tests.policies.tiny_pipelines import save_pipeline

    policy_class, pipeline_class, build, make_bare = {
        "qwen_image": (QwenImagePolicy, QwenImagePipeline, tiny.qwen_image_components, bare.qwen_image_transformer),
        "flux2": (Flux2Policy, Flux2KleinPipeline, tiny.flux2_klein_components, bare.flux2_transformer),
        "zimage": (ZImagePolicy, ZImagePipeline, tiny.zimage_components, bare.zimage_transformer)}[name]
    path = save_pipeline(pipeline_class, build, root / name)
    return policy_class(str(path), lora=lora, resolution=32, max_sequence_length=16).load(), make_bare


def measure(name: str, root: Path, batch: int, steps: int, micro_batch: int, repeats: int,
            guidance: float = 4.5, cfg_gradient: str = "cond") -> dict:
    """Rollout and training medians (flowrl and bare, seconds) and the trajectory buffer's bytes for one adapter."""
    torch.manual_seed(0)
    policy, make_bare, step_kind, noise_level = build_policy(name, root)
    method = FlowGRPO(policy, num_steps=steps, guidance_scale=guidance, step_kind=step_kind,
                      noise_level=noise_level, micro_batch_size=micro_batch, cfg_gradient=cfg_gradient)
    prompts = ["a red cat on the tree", "a photo of a blue dog"] * (batch // 2) + ["a green tree"] * (batch % 2)
    from scripts.bench_edit_calls import edit_images

    images = edit_images(name, prompts)  # an edit's sources (None: text to image)
    data = {"prompts": prompts, "seeds": torch.arange(batch), "group_ids": torch.arange(batch) // 2, "images": images}
    cond = policy.encode(prompts, images=images)
    sigmas = policy.sigmas(steps)
    bare = make_bare(policy, cond, sigmas, guidance)
    noise = bare.layout(torch.randn(batch, *policy.latent_shape()))
    rows = torch.arange(batch)

    def flowrl_rollout():
        return method.rollout(data, cond)

    @torch.no_grad()
    def bare_rollout():
        z = noise
        for k in range(steps):
            z = bare.update(z, bare.output(z, torch.full((batch,), k), rows), k)
        return z

    rollout_flowrl, rollout_bare = timed([flowrl_rollout, bare_rollout], repeats)

    rollout = flowrl_rollout()
    bare_latents = bare.layout(rollout.latents.flatten(0, 1)).unflatten(0, (batch, steps + 1))
    advantages, weights = torch.randn(batch, steps), torch.ones(batch, steps)
    pairs = rollout.train_mask.nonzero()
    params = policy.trainable_parameters()

    def flowrl_train():
        for chunk in pairs.split(micro_batch):
            loss, _ = method.pair_loss(rollout, cond, advantages, weights, chunk)
            loss.backward()
        for p in params:
            p.grad = None

    def bare_train():
        for chunk in pairs.split(micro_batch):
            b, k = chunk[:, 0], chunk[:, 1]
            bare.output(bare_latents[b, k], k, b).square().mean().backward()
        for p in params:
            p.grad = None

    train_flowrl, train_bare = timed([flowrl_train, bare_train], repeats)
    return {"model": name, "pairs": len(pairs), "rollout_flowrl": rollout_flowrl, "rollout_bare": rollout_bare,
            "train_flowrl": train_flowrl, "train_bare": train_bare, "buffer_bytes": buffer_bytes(rollout),
            "latent_bytes": latent_bytes(batch, steps, policy.latent_shape()),
            "latent_shape": tuple(policy.latent_shape())}


def table(results: list[dict]) -> str:
    """The results as a markdown table (ratios: flowrl / bare, buffer / latents)."""
    lines = ["| model | latents | trained pairs | rollout flowrl / bare (ms) | rollout ratio | training flowrl / bare "
             "(ms) | training ratio | buffer / latents (KiB) | memory ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['latent_shape']))} | {r['pairs']} | "
            f"{r['rollout_flowrl'] * 1e3:.1f} / {r['rollout_bare'] * 1e3:.1f} | "
            f"{r['rollout_flowrl'] / r['rollout_bare']:.3f} | "
            f"{r['train_flowrl'] * 1e3:.1f} / {r['train_bare'] * 1e3:.1f} | "
            f"{r['train_flowrl'] / r['train_bare']:.3f} | "
            f"{r['buffer_bytes'] / 1024:.1f} / {r['latent_bytes'] / 1024:.1f} | "
            f"{r['buffer_bytes'] / r['latent_bytes']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 5, 9, 17], help="video frames of the memory rows")
    parser.add_argument("--cfg-gradient", choices=["cond", "both"], default="cond",
                        help="FlowGRPO's training pass: cond (its default: the unconditional half without a graph, "
                             "a call of its own) or both (the CFG pair as one batch, as the bare calls)")
    args = parser.parse_args(argv)
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    for flag in ("batch", "steps", "micro_batch", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(name, Path(tmp), args.batch, args.steps, args.micro_batch, args.repeats, args.guidance,
                           args.cfg_gradient) for name in args.models]
        frames = frames_report(args.models, Path(tmp), args.frames, args.guidance)  # "" without a Wan model
    print(f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}; batch {args.batch}, "
          f"T={args.steps}, guidance {args.guidance}, micro-batch {args.micro_batch}, median of {args.repeats}, "
          f"cfg_gradient {args.cfg_gradient}")
    print(table(results) + frames)


if __name__ == "__main__":
    main()
