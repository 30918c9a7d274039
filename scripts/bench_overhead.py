"""Overhead of flowrl's rollout and PPO pass against bare loops of the same model calls, measured side by side.

    python scripts/bench_overhead.py [--model flowrl/tiny-digits] [--batch 32] [--steps 10] [--repeats 7]

Rollout: ``flowrl.sampling.sample`` (seeded per-sample noise, SDE step, log-probs, recorded latents) vs a bare
loop of the same CFG transformer calls with an Euler update. Training: flowrl's per-pair loss (log-prob
recomputation, PPO clip) forward+backward over every trained (sample, step) pair in micro-batches vs a bare
forward+backward of the same micro-batches with a mean-square loss (both with the gradient through both halves of
CFG). CFG gradient: the same training pass with ``cfg_gradient: both`` and ``cond`` (the unconditional half without
a graph), its time and the bytes its forward saves for the backward (exact activation memory: CPUs have no peak
counter). Prints medians and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flowrl.methods.flow_grpo import FlowGRPO
from flowrl.policies import TinyFlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import sample, sde_steps, trained_steps


def timed(fns, repeats: int) -> list[float]:
    """Median seconds of each function, the calls interleaved so that a change in machine load hits all alike."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def saved_bytes(forward) -> int:
    """Bytes of the tensors ``forward()`` saves for its backward (what a training pass holds until the backward)."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="flowrl/tiny-digits")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--guidance", type=float, default=4.5)
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = TinyFlowPolicy(args.model).load()
    method = FlowGRPO(policy, num_steps=args.steps, guidance_scale=args.guidance, micro_batch_size=args.micro_batch,
                      cfg_gradient="both")  # the bare loop differentiates both halves too
    prompts = ["red 3 and blue 7"] * args.batch
    seeds = torch.arange(args.batch)
    cond = policy.encode(prompts)
    sigmas = policy.sigmas(args.steps)
    shape = policy.latent_shape()
    denoiser = policy.denoiser
    both_embeds = torch.cat([cond.null_embeds, cond.embeds])
    both_pooled = torch.cat([cond.null_pooled, cond.pooled])
    noise = torch.randn(args.batch, *shape)

    def flowrl_rollout():
        velocity = lambda z, s, rows=None: policy.velocity(z, s, cond, args.guidance)  # noqa: E731
        return sample(velocity, seeds, sigmas, shape, "flow_grpo", 0.7)

    @torch.no_grad()
    def bare_rollout():
        z = noise
        for k in range(args.steps):
            t = (sigmas[k] * 1000).expand(2 * args.batch)
            out = denoiser(hidden_states=torch.cat([z, z]), encoder_hidden_states=both_embeds,
                           pooled_projections=both_pooled, timestep=t, return_dict=False)[0]
            v_u, v_c = out.chunk(2)
            z = z + (sigmas[k + 1] - sigmas[k]) * (v_u + args.guidance * (v_c - v_u))
        return z

    rollout_flowrl, rollout_bare = timed([flowrl_rollout, bare_rollout], args.repeats)

    latents, log_probs = flowrl_rollout()
    mask = trained_steps(sde_steps(args.steps, "flow_grpo"), 0.99, sigmas, "flow_grpo")
    rollout = Rollout(prompts, torch.zeros(args.batch).long(), seeds, latents, log_probs,
                      sigmas.expand(args.batch, -1), mask.expand(args.batch, -1).clone())
    advantages = torch.randn(args.batch, args.steps)
    weights = torch.ones(args.batch, args.steps)
    pairs = rollout.train_mask.nonzero()
    params = policy.trainable_parameters()

    def flowrl_train():
        for chunk in pairs.split(args.micro_batch):
            loss, _ = method.pair_loss(rollout, cond, advantages, weights, chunk)
            loss.backward()
        for p in params:
            p.grad = None

    def bare_train():
        for chunk in pairs.split(args.micro_batch):
            b, k = chunk[:, 0], chunk[:, 1]
            z = latents[b, k]
            t = (sigmas[k] * 1000).repeat(2)
            out = denoiser(hidden_states=torch.cat([z, z]), encoder_hidden_states=both_embeds[torch.cat([b, b])],
                           pooled_projections=both_pooled[torch.cat([b, b])], timestep=t, return_dict=False)[0]
            v_u, v_c = out.chunk(2)
            (v_u + args.guidance * (v_c - v_u)).square().mean().backward()
        for p in params:
            p.grad = None

    train_flowrl, train_bare = timed([flowrl_train, bare_train], args.repeats)

    def train_with(cfg_gradient: str):
        def run():
            method.cfg_gradient = cfg_gradient
            flowrl_train()
        return run

    cfg_times = timed([train_with("both"), train_with("cond")], args.repeats)
    cfg_bytes = [saved_bytes(lambda: method.pair_loss(rollout, cond, advantages, weights, pairs[:args.micro_batch]))
                 for method.cfg_gradient in ("both", "cond")]
    method.cfg_gradient = "both"
    print(f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}; batch {args.batch}, "
          f"T={args.steps}, CFG {args.guidance}, {len(pairs)} trained pairs, micro-batch {args.micro_batch}")
    print(f"rollout:  flowrl {rollout_flowrl * 1e3:8.1f} ms | bare {rollout_bare * 1e3:8.1f} ms | "
          f"ratio {rollout_flowrl / rollout_bare:.3f}")
    print(f"training: flowrl {train_flowrl * 1e3:8.1f} ms | bare {train_bare * 1e3:8.1f} ms | "
          f"ratio {train_flowrl / train_bare:.3f}")
    mib = [b / 2**20 for b in cfg_bytes]
    print(f"cfg_gradient both: {cfg_times[0] * 1e3:8.1f} ms, {mib[0]:7.2f} MiB saved for backward per micro-batch | "
          f"cond: {cfg_times[1] * 1e3:8.1f} ms, {mib[1]:7.2f} MiB | cond/both: time {cfg_times[1] / cfg_times[0]:.3f}, "
          f"memory {mib[1] / mib[0]:.3f}")


if __name__ == "__main__":
    main()
