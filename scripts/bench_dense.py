"""Dense step rewards: model evaluations per trajectory and batched ODE completions vs a serial loop over start steps.

    python scripts/bench_dense.py [--model flowrl/tiny-digits] [--batch 16] [--steps 10] [--repeats 5]

NFE: one DenseGRPO rollout (SDE sample + the ODE completion of every state before a step) through a velocity that
counts the rows it evaluates (a CFG pair is one row), divided by the trajectories. Wall time: the completions of
all ``T`` start steps of a batch with :func:`flowrl.sampling.complete_trajectories` (every (trajectory, start) pair
advances together, ``T`` model calls in all) vs a loop over start steps, each completed with its own
:func:`flowrl.sampling.ode_complete` call (``T (T + 1) / 2`` calls of ``B`` rows). Prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flowrl.policies import TinyFlowPolicy
from flowrl.sampling import complete_trajectories, ode_complete, sample


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="flowrl/tiny-digits")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    policy = TinyFlowPolicy(args.model).load().to(args.device).eval()
    prompts = [f"red {i % 10} and blue {(i + 3) % 10}" for i in range(args.batch)]
    sigmas = policy.sigmas(args.steps).to(args.device)
    rows_evaluated = [0]
    with torch.no_grad():
        cond = policy.encode(prompts)

        def velocity(z, sigma, rows):
            rows_evaluated[0] += z.shape[0]
            return policy.velocity(z, sigma, cond.select(rows), args.guidance)

        every = torch.arange(args.batch, device=args.device)
        latents, _ = sample(lambda z, s, rows: velocity(z, s, every), torch.arange(args.batch), sigmas,
                            policy.latent_shape(), "flow_grpo", 0.7, device=args.device)
        completed = complete_trajectories(velocity, latents, sigmas)
    nfe = rows_evaluated[0] / args.batch
    print(f"NFE per trajectory at T={args.steps}: {nfe:g} (sample {args.steps} + completions "
          f"{completed.nfe.sum(1).float().mean().item():g})")

    def batched():
        with torch.no_grad():
            complete_trajectories(velocity, latents, sigmas)
        sync()

    def serial():
        with torch.no_grad():
            for k in range(args.steps):
                ode_complete(velocity, latents[:, k], every, torch.full_like(every, k), sigmas)
        sync()

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    t_batched, t_serial = timed(batched, args.repeats), timed(serial, args.repeats)
    pairs = args.batch * args.steps
    print(f"completions of {pairs} (trajectory, start) pairs, B={args.batch}, T={args.steps}, CFG {args.guidance}, "
          f"{args.device}, {torch.get_num_threads()} threads")
    print(f"  batched (one ode_complete):     {t_batched * 1e3:9.1f} ms")
    print(f"  serial (loop over start steps): {t_serial * 1e3:9.1f} ms")
    print(f"  speed-up: {t_serial / t_batched:.2f}x")


if __name__ == "__main__":
    main()
