"""Peak memory of a video rollout with the noise drawn step by step (``NoiseStream``) against all steps' noise drawn
up front (as ``sample`` did before), side by side, each in a fresh process.

    python scripts/bench_rollout_memory.py [--batch 4] [--steps 10] [--frames 33] [--height 480] [--width 832]

The latents are Wan 2.1's for the given video (16 channels, 4x temporal and 8x spatial VAE compression); the model
is a stand-in (``0.1 z``) so the rollout's own buffers are what the peak measures. Each variant runs in its own
process and reports its peak resident memory above what the process held before sampling (``ru_maxrss``: the CPU
has no allocator peak counter; glibc's mmap threshold is pinned so that freed tensors leave the resident set). The trajectory buffer ``[B, T+1, ...]`` is the same in both; the noise is the
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

from flowrl.sampling.sampler import NoiseStream, sample_from, seeded_noise


def wan_latent_shape(frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Wan 2.1's VAE latents of a ``frames x height x width`` video: ``[16, (F - 1) / 4 + 1, H / 8, W / 8]``.

    >>> wan_latent_shape(33, 480, 832)
    (16, 9, 60, 104)
    """
    return 16, (frames - 1) // 4 + 1, height // 8, width // 8


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rollout(variant: str, batch: int, steps: int, shape: tuple[int, ...]) -> dict:
    seeds, sigmas = torch.arange(batch), torch.linspace(1, 0, steps + 1)
    velocity = lambda z, sigma, rows: 0.1 * z  # noqa: E731  a stand-in model: the buffers are what is measured
    before = peak_mib()
    if variant == "stream":
        noise = NoiseStream(seeds, shape, steps + 1)
        latents, _ = sample_from(velocity, noise.draw(0), sigmas, 0, noise.rest())
    else:
        noise = seeded_noise(seeds, shape, steps + 1)
        latents, _ = sample_from(velocity, noise[:, 0], sigmas, 0, noise[:, 1:])
    return {"variant": variant, "peak_mib": peak_mib() - before, "buffer_mib": latents.nbytes / 2**20,
            "checksum": float(latents[:, -1].double().sum())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the child process's one measurement
    args = parser.parse_args(argv)
    shape = wan_latent_shape(args.frames, args.height, args.width)
    if args.variant:
        print(json.dumps(rollout(args.variant, args.batch, args.steps, shape)))
        return
    # glibc keeps freed blocks above its (growing) mmap threshold in the heap, so the resident peak would count
    # buffers long freed; a fixed 64 KiB threshold hands every tensor back when freed and the peak follows live ones
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    results = []
    for variant in ("upfront", "stream"):
        out = subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                              "--variant", variant], env=env, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    upfront, stream = results
    assert upfront["checksum"] == stream["checksum"], "the two variants must draw the same noise"
    print(f"rollout of {args.batch} videos x {args.frames} frames {args.height}x{args.width} (latents {list(shape)}), "
          f"{args.steps} steps; trajectory buffer {stream['buffer_mib']:.0f} MiB")
    for r in results:
        print(f"  {r['variant']:8s} peak above start {r['peak_mib']:8.0f} MiB")
    print(f"  stream / upfront peak: {stream['peak_mib'] / upfront['peak_mib']:.3f} (same samples: checksums equal)")


if __name__ == "__main__":
    main()
