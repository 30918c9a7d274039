"""Distil the embedded teacher's classifier-free guidance into one conditional pass: a guidance-distilled base.

FLUX.1-dev and its kin are guidance-distilled: one model evaluation a step gives what CFG gives with two. This does the
same to the embedded model: each iteration draws training prompts and noise, runs the teacher's guided Euler ODE on
one of the sampling grids (``--grids``: the quickstart's 6 training steps and 10 validation steps), and regresses the
student's conditional velocity at every state of those trajectories onto the teacher's guided velocity there. The
student is the whole transformer (full fine-tuning from the teacher's weights); it is saved as a complete diffusers
folder (the teacher's tokenizer, text encoder and scheduler beside the new transformer), a base model like any other::

    OMP_NUM_THREADS=1 python scripts/distill_tiny_guidance.py --out flowrl/assets/tiny-digits-gd

``--init`` starts the student from an earlier student's folder instead of the teacher (a continued distillation; the
targets are still the teacher's; the earlier run's record is nested in ``distillation.json``). ``--layers N`` makes the
student shallower than the teacher, a cheaper model call: it starts from the teacher's blocks that ``--keep`` names (the
last block, whose context stream ends the network, always among them). It prints the held-out reward of the teacher
with CFG and of the student without, on each grid, before and after.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Optional

import torch
from diffusers import SD3Transformer2DModel

from distill_tiny_few_step import held_out_reward  # scripts/ is on the path of a script run
from flowrl.data import load_prompts
from flowrl.model_paths import resolve_model
from flowrl.policies import TinyFlowPolicy
from flowrl.rewards import DigitAlignment
from flowrl.sampling.sampler import sample


def guidance_loss(policy: TinyFlowPolicy, prompts: list[str], seeds: torch.Tensor, steps: int,
                  guidance: float) -> torch.Tensor:
    """The student's mean squared gap to the teacher's guided velocity at every state of the teacher's guided Euler
    ODE on the ``steps``-step grid from ``seeds`` (the teacher: the policy's reference, its weights before training)."""
    sigmas, cond, guided = policy.sigmas(steps), policy.encode(prompts), []
    with torch.no_grad(), policy.reference():
        latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond, guidance), seeds, sigmas,
                            policy.latent_shape(), "ode", velocities=guided)
    states = latents[:, :-1].transpose(0, 1).reshape(-1, *latents.shape[2:])  # [K B, ...] step-major, as `guided`
    v = policy.velocity(states, sigmas[:-1].repeat_interleave(len(prompts)), policy.encode(prompts * steps), 1.0)
    return (v - torch.cat(guided)).square().mean()


def kept_blocks(depth: int, layers: int, keep: Optional[list[int]]) -> list[int]:
    """The teacher's blocks a ``layers``-block student starts from: ``keep``, checked, or the first ``layers - 1``
    and the last (the teacher's last block must end the list: it alone drops the context stream)."""
    last = depth - 1
    keep = list(range(layers - 1)) + [last] if keep is None else keep
    if len(keep) != layers or keep[-1] != last or sorted(set(keep)) != keep or keep[0] < 0 or layers > depth:
        raise ValueError(f"--layers {layers} --keep {keep}: {layers} increasing block indices of the teacher's "
                         f"{depth}, ending with its last block {last} (e.g. --keep {list(range(layers - 1)) + [last]})")
    return keep


def shallow_student(teacher: SD3Transformer2DModel, keep: list[int]) -> SD3Transformer2DModel:
    """A transformer with the teacher's blocks ``keep`` (see :func:`kept_blocks`) and every other weight of the
    teacher."""
    student = SD3Transformer2DModel.from_config({**teacher.config, "num_layers": len(keep)})
    renamed = {}
    for name, value in teacher.state_dict().items():
        if name.startswith("transformer_blocks."):
            index, rest = name.split(".", 2)[1:]
            if int(index) not in keep:
                continue
            name = f"transformer_blocks.{keep.index(int(index))}.{rest}"
        renamed[name] = value
    student.load_state_dict(renamed)  # strict: every student weight comes from the teacher
    return student


def save_folder(policy: TinyFlowPolicy, teacher: Path, out: Path) -> None:
    """The teacher's folder with the student's transformer in place of its own."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(teacher, out, ignore=shutil.ignore_patterns("transformer"))
    policy.denoiser.save_pretrained(out / "transformer")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="flowrl/tiny-digits")
    parser.add_argument("--out", default="flowrl/assets/tiny-digits-gd")
    parser.add_argument("--init", default=None, help="start the student from this student's folder (default: the "
                        "teacher's weights)")
    parser.add_argument("--layers", type=int, default=None, help="the student's blocks (default: the teacher's)")
    parser.add_argument("--keep", type=int, nargs="+", default=None,
                        help="the teacher's blocks a --layers student starts from (default: the first N-1 and the last)")
    parser.add_argument("--guidance", type=float, default=4.5, help="the teacher's CFG scale the student learns")
    parser.add_argument("--grids", type=int, nargs="+", default=[6, 10], help="the step counts trajectories use")
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=32, help="prompts (trajectories) per iteration")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval_seeds", type=int, default=2)
    parser.add_argument("--val_limit", type=int, default=None, help="the first N held-out prompts only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.grids) < 1:
        parser.error(f"--grids {args.grids}: every grid needs at least 1 step")
    if args.layers is not None and args.init:
        parser.error("--layers and --init: a continued distillation keeps its student's depth; give one of them")
    if args.keep is not None and args.layers is None:
        parser.error(f"--keep {args.keep} without --layers: give --layers {len(args.keep)}")
    torch.manual_seed(args.seed)
    teacher_path = resolve_model(args.teacher)
    init = Path(resolve_model(args.init)) if args.init else None  # a missing folder fails before anything loads
    policy, keep = TinyFlowPolicy(args.teacher, lora=None), None
    if args.layers is not None:  # checked on the teacher's config, before its weights load
        try:
            keep = kept_blocks(policy.denoiser_config.num_layers, args.layers, args.keep)
        except ValueError as error:
            parser.error(str(error))
    policy.load().setup_reference()
    if init:  # the reference (the targets' model) stays the teacher
        policy.denoiser = SD3Transformer2DModel.from_pretrained(init, subfolder="transformer")
    elif keep is not None:
        policy.denoiser = shallow_student(policy.denoiser, keep)
    reward = DigitAlignment()
    reward.load("cpu")
    train = load_prompts("configs/prompts/digits_train_large.txt")
    val = load_prompts("configs/prompts/digits_val.txt")[:args.val_limit]
    result: dict = {}
    if init and (init / "distillation.json").exists():  # the record of the run it continues (nested: those before)
        result["earlier"] = json.loads((init / "distillation.json").read_text())

    def evaluate(tag: str) -> None:
        for steps in args.grids:
            if tag == "before":
                with policy.reference():
                    result[f"teacher_{steps}"] = held_out_reward(policy, reward, val, steps, args.guidance,
                                                                 args.eval_seeds)
            result[f"{tag}_{steps}"] = held_out_reward(policy, reward, val, steps, 1.0, args.eval_seeds)
        scores = ", ".join(f"{k} {v:.4f}" for k, v in result.items() if isinstance(v, float))
        print(f"held-out reward {tag}: {scores}", flush=True)

    evaluate("before")
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.lr, weight_decay=0.0)
    gen, started = torch.Generator().manual_seed(args.seed), time.time()
    for it in range(args.iterations):
        steps = args.grids[it % len(args.grids)]
        prompts = [train[i] for i in torch.randint(len(train), (args.batch_size,), generator=gen).tolist()]
        seeds = torch.randint(2**62, (args.batch_size,), generator=gen)
        loss = guidance_loss(policy, prompts, seeds, steps, args.guidance)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (it + 1) % 25 == 0:
            print(f"iteration {it + 1}: loss {loss.item():.5f} ({time.time() - started:.0f} s)", flush=True)
    result.update(init=args.init, layers=policy.denoiser.config.num_layers, keep=keep,
                  seed=args.seed, iterations=args.iterations, batch_size=args.batch_size, lr=args.lr,
                  grids=args.grids, guidance=args.guidance, seconds=round(time.time() - started))
    evaluate("after")
    save_folder(policy, teacher_path, Path(args.out))
    (Path(args.out) / "distillation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
