"""Memory per rank and throughput of the strategies on the embedded model, measured in one run of each.

    OMP_NUM_THREADS=1 python scripts/bench_sharding.py [--batches 5] [--local-batch 32] [--out /tmp/bench_sharding]

Runs ``python -m flowrl fit`` on ``configs/quickstart.yaml`` with full fine-tuning (``lora: null``) and a KL term
(``beta: 0.04``, so the frozen reference copy exists) on 1 process, on 2 DDP processes and on 2 FSDP2 processes,
each CPU process on one thread. The local batch is fixed (weak scaling: 2 processes train twice the samples per
batch). A probe callback records on every rank:

- bytes of the denoiser and of its reference that the rank holds (its shard under FSDP2, the whole under DDP), of the
  gradients just before an optimizer step, and of the optimizer state (AdamW's two moments);
- peak resident memory of the process (``ru_maxrss``): mostly the Python and torch runtime for a model this small;
- wall time of each training batch after the first (rollout, rewards, update).

It prints one table (bytes per rank, seconds per batch, samples per second over all ranks) and the ratio of the
FSDP2 bytes per rank to the DDP ones. CPU numbers measure the sharding, not GPU speed: on a shared 2-core machine the
2-process runs compete for the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"1 process": [], "DDP x2": ["--trainer.devices=2", "--trainer.strategy=ddp"],
        "FSDP2 x2": ["--trainer.devices=2", "--trainer.strategy=fsdp2"]}


def held(tensors) -> int:
    """Bytes of ``tensors`` this rank holds (a DTensor's local shard)."""
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors if t is not None)


class ScalingProbe(Callback):
    """Writes ``<out>/rank<r>.json``: bytes held, peak RSS and per-batch wall times (see the module docstring)."""

    def __init__(self, out: str):
        self.out, self.times, self.grad_bytes, self._start = Path(out), [], 0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._start)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grad_bytes = max(self.grad_bytes, held(p.grad for p in pl_module.policy.trainable_parameters()))

    def on_train_end(self, trainer, pl_module):
        policy = pl_module.policy
        state = [v for s in trainer.optimizers[0].state.values() for v in s.values() if torch.is_tensor(v)]
        record = {"denoiser": held(policy.denoiser.parameters()),
                  "reference": held(policy.reference_denoiser.parameters()) if policy.reference_denoiser else 0,
                  "gradients": self.grad_bytes, "optimizer": held(t for t in state if t.dim() > 0),
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "batch_s": self.times[1:], "local_batch": trainer.datamodule.layout.local_batch_size}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def run(name: str, extra: list[str], args) -> list[dict]:
    out = Path(args.out) / name.replace(" ", "_")
    groups = args.local_batch // 8 * (2 if extra else 1)
    cmd = [sys.executable, "-m", "flowrl", "fit", "--config", "configs/quickstart.yaml",
           "--model.init_args.policy.init_args.lora=null", "--model.init_args.beta=0.04",
           f"--trainer.max_steps={2 * args.batches}", f"--data.num_groups={groups}",
           "--model.init_args.micro_batch_size=32", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
           "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}",
           "--trainer.callbacks=[{class_path: flowrl.rewards.DigitAlignment}]",
           "--trainer.callbacks+=scripts.bench_sharding.ScalingProbe", f"--trainer.callbacks.out={out}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=5, help="training batches per run (2 optimizer steps each)")
    parser.add_argument("--local-batch", type=int, default=32, help="samples per process per batch (multiple of 8)")
    parser.add_argument("--out", default="/tmp/bench_sharding")
    args = parser.parse_args()
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    print(f"embedded model, full fine-tuning + KL reference, local batch {args.local_batch}, {args.batches} batches; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("| run | denoiser MiB/rank | reference MiB/rank | grads MiB/rank | AdamW state MiB/rank | peak RSS MiB/rank "
          "| s/batch | samples/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    found = {}
    for name, extra in RUNS.items():
        ranks = found[name] = run(name, extra, args)
        r0 = max(ranks, key=lambda r: r["denoiser"])  # the rank holding most (FSDP2 pads uneven shards)
        seconds = statistics.median(max(r["batch_s"][i] for r in ranks) for i in range(len(r0["batch_s"])))
        samples = sum(r["local_batch"] for r in ranks)
        print(f"| {name} | {mib(r0['denoiser'])} | {mib(r0['reference'])} | {mib(r0['gradients'])} | "
              f"{mib(r0['optimizer'])} | {max(r['peak_rss'] for r in ranks) / 2**20:.0f} | {seconds:.2f} | "
              f"{samples / seconds:.1f} |")
    ddp, fsdp = (max(found[k], key=lambda r: r["denoiser"]) for k in ("DDP x2", "FSDP2 x2"))
    model = lambda r: r["denoiser"] + r["reference"] + r["gradients"] + r["optimizer"]  # noqa: E731
    print(f"FSDP2 / DDP model bytes per rank (weights, reference, gradients, optimizer state): "
          f"{model(fsdp) / model(ddp):.3f}")


if __name__ == "__main__":
    main()
