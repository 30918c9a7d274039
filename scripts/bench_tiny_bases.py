"""One model call of each embedded base, side by side: what a quickstart batch is made of.

    python scripts/bench_tiny_bases.py [--models flowrl/tiny-digits-gd flowrl/tiny-digits-gd3] [--rows 128]
        [--repeats 7] [--threads N]

Each base is loaded as the quickstart loads it (LoRA r32, alpha 64: a no-gradient call runs the adapters too) and
called on the same ``rows`` latents and prompts, the calls interleaved so that a change in machine load hits all
alike (``bench_overhead.timed``): the median seconds of a no-gradient call (a rollout or validation step) and of a
training call (forward and backward of a mean-square loss), and each base's time over the first one's.
"""

from __future__ import annotations

import argparse

import torch

from bench_overhead import timed  # scripts/ is on the path of a script run
from flowrl.policies import LoraOptions, TinyFlowPolicy


def calls(path: str, rows: int):
    """The no-gradient and the training call of base ``path`` on ``rows`` fixed inputs."""
    policy = TinyFlowPolicy(path, lora=LoraOptions(rank=32, alpha=64)).load()
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(rows, *policy.latent_shape(), generator=generator)
    sigma, cond = torch.rand(rows, generator=generator), policy.encode(["red 3 and blue 7"] * rows)

    def rollout():
        with torch.no_grad():
            policy.velocity(latents, sigma, cond)

    def train():
        policy.velocity(latents, sigma, cond).square().mean().backward()

    return rollout, train


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["flowrl/tiny-digits-gd", "flowrl/tiny-digits-gd3"])
    parser.add_argument("--rows", type=int, default=128, help="rows a call (the quickstart's rollouts: 192)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = [calls(path, args.rows) for path in args.models]
    rollout = timed([r for r, _ in pairs], args.repeats)
    train = timed([t for _, t in pairs], args.repeats)
    print(f"{args.rows} rows a call, {torch.get_num_threads()} threads, median of {args.repeats}")
    rows = []
    for path, r, t in zip(args.models, rollout, train):
        rows.append({"model": path, "no_grad_s": r, "train_s": t, "no_grad_ratio": r / rollout[0],
                     "train_ratio": t / train[0]})
        print(f"{path}: no-gradient call {1000 * r:.1f} ms ({r / rollout[0]:.2f}x), forward and backward "
              f"{1000 * t:.1f} ms ({t / train[0]:.2f}x)")
    return rows


if __name__ == "__main__":
    main()
