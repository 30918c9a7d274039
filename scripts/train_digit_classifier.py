"""Train the digit canvas reward classifier.

Every batch is a fresh set of random compositions of train-split digits, so the
classifier sees far more canvases than there are digit images and cannot
memorise pairings.  Light augmentation (a pixel of jitter, brightness changes,
noise) makes it tolerant of the slightly off-distribution images a generator
produces, without changing the canvas layout the heads depend on.

Evaluation uses canvases composed from the held-out test digits; the mean
``alignment`` there is the reward "ceiling" a perfect generator would reach.

    python scripts/train_digit_classifier.py  # ~1-2 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from flowrl.digit_canvas import parse_prompt, random_specs, render_specs, sample_canvases
from flowrl.rewards.digit_classifier import HEADS, DigitCanvasClassifier

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "flowrl" / "assets" / "digit-classifier"


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    b = images.shape[0]
    # Shift by at most one pixel: enough to be robust, too little to cross the left/right border.
    shifts = torch.randint(-1, 2, (b, 2), generator=generator)
    padded = F.pad(images, (1, 1, 1, 1))
    images = torch.stack(
        [padded[i, :, 1 + dy : 17 + dy, 1 + dx : 17 + dx] for i, (dy, dx) in enumerate(shifts.tolist())]
    )
    brightness = 0.6 + 0.6 * torch.rand(b, 1, 1, 1, generator=generator)
    noise_level = 0.15 * torch.rand(b, 1, 1, 1, generator=generator)
    noise = noise_level * torch.randn(images.shape, generator=generator)
    return (images * brightness + noise).clamp(0, 1)


@torch.no_grad()
def evaluate(model: DigitCanvasClassifier, n: int, seed: int) -> tuple[dict[str, float], float]:
    model.eval()
    images, prompts = sample_canvases(n, seed, split="test")
    specs = [parse_prompt(p) for p in prompts]
    logits = model(images)
    targets = model.targets(specs)
    accuracy = {k: (logits[k].argmax(-1) == targets[k]).float().mean().item() for k in HEADS}
    ceiling = model.alignment(images, specs).mean().item()
    return accuracy, ceiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    model = DigitCanvasClassifier()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"DigitCanvasClassifier: {n_params / 1e3:.1f}k parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        model.train()
        specs = random_specs(args.batch_size, generator)
        images = augment(render_specs(specs, generator, split="train"), generator)
        logits = model(images)
        targets = model.targets(specs)
        loss = sum(F.cross_entropy(logits[k], targets[k]) for k in HEADS)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 250 == 0 or step == args.steps:
            print(f"step {step:5d}  loss {loss.item():.4f}  ({time.perf_counter() - start:.0f}s)")

    accuracy, ceiling = evaluate(model, args.eval_size, seed=args.seed + 1)
    print(f"train time {time.perf_counter() - start:.1f}s")
    print("test accuracy: " + "  ".join(f"{k} {v:.4f}" for k, v in accuracy.items()))
    print(f"mean alignment on real test canvases (reward ceiling): {ceiling:.4f}")

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
