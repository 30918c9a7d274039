"""Distil the embedded teacher into a K-step, CFG-free LoRA generator: TDM-R1's few-step base on the embedded model.

TDM-R1 (arXiv 2603.07700) reinforces a distilled few-step generator (the authors start from a TDM LoRA of SD3.5-M).
The embedded teacher sampled at K=4 steps without CFG does not serve (docs/methods/tdm_r1.md has the numbers), so
this script makes one by trajectory regression: each iteration draws prompts and noise, runs the teacher's Euler ODE
(``teacher_steps`` steps, a multiple of K, CFG ``teacher_guidance``), and regresses the student's conditional velocity
at the teacher's state on each of the K grid points onto the teacher's mean velocity over that interval,
``(z_{k+1} - z_k) / (sigma_{k+1} - sigma_k)``, so one student Euler step follows several guided teacher steps. It
prints the held-out reward of the student and the teacher before and after, and writes the LoRA (diffusers layout)
that ``TDMR1(generator_init=...)`` loads::

    OMP_NUM_THREADS=1 python scripts/distill_tiny_few_step.py --out flowrl/assets/tiny-digits-k4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from flowrl.data import load_prompts
from flowrl.methods.base import BaseModule
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.policies.adapter_weights import save_adapter
from flowrl.rewards import DigitAlignment
from flowrl.sampling.sampler import sample


def held_out_reward(policy, reward, prompts, steps: int, guidance: float, seeds: int) -> float:
    """Mean reward of ODE samples of every prompt with seeds ``1000 s + i`` for ``s < seeds``."""
    method = BaseModule(policy, num_steps=steps, guidance_scale=guidance)
    generate = method.generation.generate
    scores = [reward.score(generate(prompts, torch.arange(len(prompts)) + 1000 * s, steps), prompts, None)
              for s in range(seeds)]
    return float(torch.cat(scores).mean())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="flowrl/assets/tiny-digits-k4")
    parser.add_argument("--steps", type=int, default=4, help="K, the student's steps")
    parser.add_argument("--teacher_steps", type=int, default=12,
                        help="the teacher ODE's steps (a multiple of K: each student step is cut into equal ones)")
    parser.add_argument("--teacher_guidance", type=float, default=4.5)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 rank), as configs/tiny_tdm_r1.yaml")
    parser.add_argument("--eval_seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.teacher_steps % args.steps:
        parser.error(f"--teacher_steps={args.teacher_steps} must be a multiple of --steps={args.steps}")
    torch.manual_seed(args.seed)
    policy = TinyFlowPolicy("flowrl/tiny-digits", lora=LoraOptions(rank=args.rank, alpha=2 * args.rank)).load()
    reward = DigitAlignment()
    reward.load("cpu")
    train, val = load_prompts("configs/prompts/digits_train_large.txt"), load_prompts("configs/prompts/digits_val.txt")
    sigmas, every = policy.sigmas(args.steps), args.teacher_steps // args.steps
    # the teacher's grid: each of the student's intervals cut into `every` equal steps
    teacher_sigmas = torch.cat([*(torch.linspace(float(a), float(b), every + 1)[:-1] for a, b in
                                  zip(sigmas[:-1], sigmas[1:])), sigmas[-1:]])
    result = {"teacher": held_out_reward(policy, reward, val, 10, args.teacher_guidance, args.eval_seeds),
              "before": held_out_reward(policy, reward, val, args.steps, 1.0, args.eval_seeds)}
    print(f"held-out reward: teacher (10 steps, CFG {args.teacher_guidance}) {result['teacher']:.4f}; "
          f"{args.steps} steps without CFG before distillation {result['before']:.4f}", flush=True)
    optimizer = torch.optim.AdamW(policy.trainable_parameters("default"), lr=args.lr, weight_decay=1e-4)
    gen, started = torch.Generator().manual_seed(args.seed), time.time()
    for it in range(args.iterations):
        prompts = [train[i] for i in torch.randint(len(train), (args.batch_size,), generator=gen).tolist()]
        cond = policy.encode(prompts)
        seeds = torch.randint(2**62, (args.batch_size,), generator=gen)
        with torch.no_grad(), policy.reference():  # the teacher: the backbone alone, guided
            latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond, args.teacher_guidance), seeds, teacher_sigmas,
                                policy.latent_shape(), "ode")
        states = latents[:, ::every]  # [B, K + 1, ...] the teacher's states on the student's grid
        k = torch.randint(args.steps, (args.batch_size,), generator=gen)
        rows = torch.arange(args.batch_size)
        target = (states[rows, k + 1] - states[rows, k]) / (sigmas[k + 1] - sigmas[k]).view(-1, 1, 1, 1)
        v = policy.velocity(states[rows, k], sigmas[k], cond, 1.0)
        loss = (v - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (it + 1) % 50 == 0:
            print(f"iteration {it + 1}: loss {loss.item():.4f} ({time.time() - started:.0f} s)", flush=True)
    result["after"] = held_out_reward(policy, reward, val, args.steps, 1.0, args.eval_seeds)
    result.update(iterations=args.iterations, batch_size=args.batch_size, lr=args.lr, teacher_steps=args.teacher_steps,
                  seconds=round(time.time() - started), rank=args.rank)
    print(f"held-out reward: {args.steps} steps without CFG after distillation {result['after']:.4f} "
          f"({result['seconds']} s)", flush=True)
    save_adapter(policy, "default", args.out)
    (Path(args.out) / "distillation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
