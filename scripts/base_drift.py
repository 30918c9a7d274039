"""How far a trained policy drifted from its base model: one definition for every method of the comparison.

    OMP_NUM_THREADS=1 python scripts/base_drift.py runs/compare/tiny_dppo/seed0 --prompts configs/prompts/digits_val.txt

Along the trained model's own Flow-GRPO SDE trajectories (``noise_level`` 0.7 on every one of its ``num_steps``
steps, the method's own ``guidance_scale``; one sample per held-out prompt, seeded like validation's), at each state
the trained velocity ``v`` and the base model's ``v_ref`` (the LoRA adapter disabled: ``policy.reference()``) give

- ``kl``: the exact KL of the two Gaussian transitions (:func:`flowrl.losses.gaussian_mean_kl` of the
  :func:`flowrl.sampling.steps.flow_grpo_step` means, per latent dimension), summed over the steps: by the chain rule
  the KL of the trained SDE's whole trajectory distribution to the base's (what Flow-GRPO's ``beta`` term
  penalises, one step at a time), a Monte Carlo mean over the prompts;
- ``velocity_mse``: ``mean((v - v_ref)^2)`` over steps, dimensions and prompts (DiffusionNFT's and AWM's
  reference term), a sampler-free companion.

The weights are the ones validation scored: the EMA average where the run kept a ``flowrl.callbacks.EMA`` (AWM,
DiffusionNFT), else the trained adapter, from the run's ``last.ckpt``, which must hold the run's final step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

from flowrl.checkpoints.loading import load_policy, read_checkpoint
from flowrl.data import eval_batches
from flowrl.losses import gaussian_mean_kl
from flowrl.policies.base import FlowPolicy
from flowrl.prompt_records import load_records
from flowrl.sampling.sampler import sample
from flowrl.sampling.steps import flow_grpo_step

NOISE_LEVEL = 0.7  # the Flow-GRPO configs' SDE: the one transition kernel every method is measured with


@torch.no_grad()
def drift(policy: FlowPolicy, prompts: list[str], seeds: torch.Tensor, guidance_scale: float, num_steps: int,
          noise_level: float = NOISE_LEVEL) -> dict[str, torch.Tensor]:
    """Per prompt ``[B]``: ``kl`` (the SDE path KL, trained to base, per latent dimension) and ``velocity_mse`` of
    ``policy`` (trained adapter active) against its base along its own SDE trajectories from ``seeds``."""
    cond = policy.encode(prompts)
    sigmas = policy.sigmas(num_steps)
    trained: list[torch.Tensor] = []
    latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond.select(rows), guidance_scale), seeds, sigmas,
                        policy.latent_shape(), "flow_grpo", noise_level, velocities=trained)
    kl, mse = torch.zeros(len(prompts)), torch.zeros(len(prompts))
    for k, v in enumerate(trained):
        z, sigma, sigma_next = latents[:, k], sigmas[k].expand(len(prompts)), sigmas[k + 1].expand(len(prompts))
        with policy.reference():
            v_ref = policy.velocity(z, sigma, cond, guidance_scale)
        step, base = (flow_grpo_step(z, u, sigma, sigma_next, z_next=latents[:, k + 1], noise_level=noise_level)
                      for u in (v, v_ref))
        kl += gaussian_mean_kl(step.mean, base.mean, step.std)
        mse += (v.float() - v_ref.float()).square().flatten(1).mean(1) / num_steps
    return {"kl": kl, "velocity_mse": mse}


def run_drift(run: Path, prompts: list[str], batch_size: int = 64) -> dict[str, float]:
    """:func:`drift` of a fit run's folder (its ``*/version_*/checkpoints/last.ckpt`` and ``config.yaml``), means
    over ``prompts`` (validation's seeds), with the step the checkpoint holds and, where the run had a
    ``flowrl.callbacks.EvaluationBudget``, the model evaluations it had spent (to tell a final checkpoint)."""
    (ckpt,) = sorted(run.glob("*/version_*/checkpoints/last.ckpt"))[-1:]
    checkpoint = read_checkpoint(ckpt)
    ema = any(k.startswith("EMA") for k in checkpoint.get("callbacks", {}))
    policy = load_policy(ckpt, ema=ema).eval()
    config = yaml.safe_load((ckpt.parent.parent / "config.yaml").read_text())
    init, seed = config["model"]["init_args"], config["data"].get("seed", 0)
    sums = {"kl": 0.0, "velocity_mse": 0.0}
    for batch in eval_batches(prompts, 1, batch_size, 10_000 * (seed + 1)):  # validation's seeds
        for key, values in drift(policy, batch["prompts"], batch["seeds"], init.get("guidance_scale", 1.0),
                                 init.get("eval_num_steps") or init.get("num_steps", 10)).items():
            sums[key] += float(values.sum())
    budget = next((v for k, v in checkpoint.get("callbacks", {}).items() if k.startswith("EvaluationBudget")), {})
    return {"global_step": checkpoint["global_step"], "spent": budget.get("spent"), "ema": ema,
            **{k: v / len(prompts) for k, v in sums.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="fit runs' folders (--trainer.default_root_dir)")
    parser.add_argument("--prompts", default="configs/prompts/digits_val.txt", help="held-out prompts (a file, or a list in YAML flow style)")
    args = parser.parse_args(argv)
    source = yaml.safe_load(args.prompts) if args.prompts.startswith("[") else args.prompts
    prompts = [r.prompt for r in load_records(source)]
    for run in args.runs:
        print(json.dumps({"run": str(run), **run_drift(run, prompts)}), flush=True)


if __name__ == "__main__":
    main()
