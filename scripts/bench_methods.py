"""Every method on the embedded model, side by side in one process: model evaluations per prompt, per row (a
trajectory, or a tree's leaf) and per trained transition, wall time per trained transition, and the rollout buffer
against the unique latents it must hold.

    OMP_NUM_THREADS=1 python scripts/bench_methods.py --prompts 4 --batches 3

Each method runs its tiny config (``configs/tiny_<method>.yaml``, T=10, its published shape: Flow-GRPO, DenseGRPO and
TP-GRPO with 8 samples per prompt, the tree methods with one tree per prompt) through ``python -m flowrl fit`` for
``--batches`` batches of ``--prompts`` prompts; the first batch is a warm-up, the others are timed (the whole
training step: sampling, scoring, completions, the update). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
METHODS = {"Flow-GRPO": "tiny_flow_grpo", "DenseGRPO": "tiny_dense_grpo", "TP-GRPO": "tiny_tp_grpo",
           "TempFlow-GRPO": "tiny_tempflow_grpo", "Dynamic-TreeRPO": "tiny_tree_rpo", "BranchGRPO": "tiny_branch_grpo"}


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view costs its whole storage, once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if torch.is_tensor(t)}
    return sum(storages.values())


class Measure(Callback):
    """Times each training step and records what the rollout held."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.started = time.perf_counter()
        original = pl_module.rollout_and_score

        def recording(batch, cond):
            rollout = original(batch, cond)
            self.rollout = rollout
            return rollout

        pl_module.rollout_and_score = recording

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        seconds = time.perf_counter() - self.started
        del pl_module.rollout_and_score
        r = self.rollout
        latents = r.node_latents if r.node_latents is not None else r.latents
        buffer = storage_bytes([r.latents, r.node_latents, r.state_index, r.log_probs, r.sigmas, r.train_mask,
                                r.node_ids, r.cond_rows, r.nfe, r.seeds, r.group_ids])
        self.rows.append({"seconds": seconds, "evaluations": float(r.nfe.sum()), "rows": r.batch_size,
                          "prompts": len(set(batch["prompts"])), "transitions": int(r.trained_once().sum()),
                          "buffer": buffer, "latents": latents.numel() * latents.element_size()})


def run(config: str, prompts: int, batches: int, out: Path) -> list[dict]:
    from flowrl.cli import main

    main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), f"--trainer.default_root_dir={out}",
          f"--data.num_groups={prompts}", f"--trainer.max_steps={batches}", "--trainer.logger=false",
          "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]",
          "--trainer.callbacks+=flowrl.rewards.DigitAlignment", "--trainer.callbacks+=bench_methods.Current",
          "--data.val_prompts=null", "--model.init_args.micro_batch_size=256"])
    return Current.measure.rows[1:]


class Current(Measure):
    """The Measure instance of the current run (LightningCLI builds callbacks from their class path)."""

    measure = None

    def __init__(self):
        super().__init__()
        Current.measure = self


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--batches", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_methods"))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    args = parser.parse_args(argv)
    sys.modules.setdefault("bench_methods", sys.modules[__name__])
    print(f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}; T=10, {args.prompts} prompts "
          f"per batch, {args.batches - 1} timed batches")
    print("| method | rows per prompt | NFE per prompt | NFE per row | NFE per trained transition | trained "
          "transitions per batch | ms per trained transition | buffer / unique latents |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.methods:
        config = METHODS[name]
        rows = run(config, args.prompts, args.batches, args.out / config)
        mean = lambda key: statistics.fmean(r[key] for r in rows)  # noqa: E731
        per_prompt = mean("evaluations") / mean("prompts")
        print(f"| {name} | {mean('rows') / mean('prompts'):.0f} | {per_prompt:.0f} | "
              f"{mean('evaluations') / mean('rows'):.2f} | {mean('evaluations') / mean('transitions'):.2f} | "
              f"{mean('transitions'):.0f} | {1000 * mean('seconds') / mean('transitions'):.1f} | "
              f"{mean('buffer') / mean('latents'):.3f} |", flush=True)


if __name__ == "__main__":
    main()
