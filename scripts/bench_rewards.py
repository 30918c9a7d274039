"""Reward throughput at tiny size, and how much of a slow remote reward's latency overlap hides.

    python scripts/bench_rewards.py [--batch 32] [--size 64] [--delay 0.2] [--chunk 4] [--rounds 5]

1. Images/s of every reward callback that exists, each built as its tests build it (tiny random-weight models
   saved to a temp folder and loaded through the real ``from_pretrained`` path; the embedded digit classifier;
   the real rapidocr engine); a reward whose builder is missing is reported as skipped.
2. The training step of the embedded tiny model (``flowrl/tiny-digits``) with a reward server whose reward sleeps
   ``--delay`` seconds per request (one request at a time), sampled in chunks of ``--chunk``: local reward
   (no latency), ``RemoteReward(overlap=False)`` and ``RemoteReward(overlap=True)``. Hidden fraction =
   (step without overlap - step with overlap) / (step without overlap - local step).

Run from the repository root (it imports the tests' tiny-model builders and server launcher).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' builders


def tiny_clip_rewards(root: Path) -> dict:
    from flowrl.rewards.aesthetic import Aesthetic, AestheticHead
    from flowrl.rewards.clip_score import CLIPScore
    from flowrl.rewards.hps import HPSv2
    from flowrl.rewards.pickscore import PickScore
    from tests.rewards.tiny_clip import PROJECTION_DIM, save_tiny_clip

    clip = str(save_tiny_clip(root / "clip"))
    head = root / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save(AestheticHead(PROJECTION_DIM).state_dict(), head)
    return {"PickScore": lambda: PickScore(model=clip, processor=clip),
            "HPSv2": lambda: HPSv2(model=clip, processor=clip),
            "CLIPScore": lambda: CLIPScore(model=clip),
            "Aesthetic": lambda: Aesthetic(model=clip, head=str(head))}


def tiny_image_reward(root: Path):
    from transformers import BertTokenizer

    from flowrl.rewards import ImageReward
    from flowrl.rewards.image_reward_model import ImageRewardModel
    from tests.rewards.test_image_reward import WORDS, blip_config

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    ImageRewardModel(blip_config(len(tokenizer))).save_pretrained(root / "image_reward")
    tokenizer.save_pretrained(root / "image_reward")
    return lambda: ImageReward(model=str(root / "image_reward"))


def reward_builders(root: Path) -> dict:
    """``{name: () -> reward}``, or ``{name: "skipped: why"}`` where a reward's code is not there (yet)."""
    from flowrl.rewards import DigitAlignment, JpegCompressibility, JpegIncompressibility

    out = {"JpegCompressibility": JpegCompressibility, "JpegIncompressibility": JpegIncompressibility,
           "DigitAlignment": DigitAlignment}
    for label, group in (("CLIP-based", tiny_clip_rewards),
                         ("ImageReward", lambda r: {"ImageReward": tiny_image_reward(r)})):
        try:
            out.update(group(root))
        except (ImportError, AttributeError, OSError) as err:
            out[label] = f"skipped: {err!r}"
    try:
        from flowrl.rewards import OcrReward

        out["OcrReward (rapidocr)"] = OcrReward
    except ImportError as err:
        out["OcrReward"] = f"skipped: {err!r}"
    return out


def throughput(reward, images: torch.Tensor, prompts: list[str], repeats: int = 3) -> float:
    if hasattr(reward, "load"):
        reward.load("cpu")
    reward.score(images[:2], prompts[:2])  # warm-up (imports and loads the engine)
    logging.getLogger("RapidOCR").setLevel(logging.ERROR)  # "text detection result is empty" on noise images
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reward.score(images, prompts)
        times.append(time.perf_counter() - start)
    return len(prompts) / statistics.median(times)


def bench_throughput(args, root: Path) -> None:
    digits, text = ["red 3 and blue 7"] * args.batch, ['a sign that says "flow"'] * args.batch
    print(f"reward throughput, {args.batch} random images of {args.size}x{args.size} (DigitAlignment 16x16), "
          "median of 3")
    for name, build in reward_builders(root).items():
        if isinstance(build, str):
            print(f"  {name:24s} {build}")
            continue
        try:
            prompts = text if name.startswith("Ocr") else digits
            size = 16 if name == "DigitAlignment" else args.size  # the digit canvas is 16x16
            images = torch.rand(args.batch, 3, size, size, generator=torch.Generator().manual_seed(0))
            print(f"  {name:24s} {throughput(build(), images, prompts):10.1f} images/s")
        except Exception as err:  # one broken reward must not hide the others' numbers
            print(f"  {name:24s} failed: {err!r}")


class StepTimer(Callback):
    """Seconds per training step (``on_train_batch_start`` -> ``end``)."""

    def __init__(self):
        self.times, self._start = [], 0.0

    def on_train_batch_start(self, *_):
        self._start = time.perf_counter()

    def on_train_batch_end(self, *_):
        self.times.append(time.perf_counter() - self._start)


def step_times(args, reward) -> list[float]:
    from lightning.pytorch import Trainer

    from flowrl.data import PromptDataModule
    from flowrl.methods import FlowGRPO
    from flowrl.policies import TinyFlowPolicy

    torch.manual_seed(0)
    method = FlowGRPO(TinyFlowPolicy().load(), num_steps=args.num_steps, micro_batch_size=32,
                      timestep_fraction=0.25, sample_chunk_size=args.chunk)
    timer = StepTimer()
    trainer = Trainer(accelerator="cpu", max_steps=args.steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      use_distributed_sampler=False, callbacks=[reward, timer])
    data = PromptDataModule(["red 1 and blue 2", "green 3 and red 4"], group_size=args.group_size, num_groups=2)
    trainer.fit(method, datamodule=data)
    return timer.times[1:]  # the first step warms up


def bench_overlap(args, root: Path) -> None:
    from flowrl.rewards import RemoteReward
    from tests.rewards.served import MeanPixel
    from tests.rewards.server_process import reward_server

    config = root / "slow_reward.yaml"
    config.write_text(f"rewards:\n  - class_path: tests.rewards.served.MeanPixel\n    init_args: {{delay: {args.delay}}}\n"
                      "max_batch_size: 1\n")
    batch = 2 * args.group_size
    chunks = -(-batch // args.chunk)
    times = {"local": [], "sync": [], "overlap": []}
    with reward_server(str(config), root) as (url, _):
        for _ in range(args.rounds):  # interleaved, so drifting load on a shared machine hits all three alike
            times["local"] += step_times(args, MeanPixel())
            times["sync"] += step_times(args, RemoteReward(url, overlap=False))
            times["overlap"] += step_times(args, RemoteReward(url, overlap=True, max_workers=1))
    local, sync, overlap = (statistics.median(times[k]) for k in ("local", "sync", "overlap"))
    latency = sync - local
    print(f"\ntraining step, tiny model, batch {batch}, {args.num_steps} sampling steps, {chunks} chunks of "
          f"{args.chunk}, remote reward sleeping {args.delay * 1000:.0f} ms per request (median of "
          f"{len(times['local'])} steps each)")
    print(f"  local reward (no latency)   {local:7.3f} s")
    print(f"  remote, no overlap          {sync:7.3f} s  (reward latency {latency:.3f} s)")
    print(f"  remote, overlap             {overlap:7.3f} s")
    print(f"  hidden fraction of reward latency: {(sync - overlap) / latency:.1%} "
          f"(ideal with {chunks} chunks: {(chunks - 1) / chunks:.1%}, the last chunk cannot overlap)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="images per throughput measurement")
    parser.add_argument("--size", type=int, default=64, help="image side for the throughput measurement")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the remote reward sleeps per request")
    parser.add_argument("--chunk", type=int, default=4, help="sample_chunk_size of the training step")
    parser.add_argument("--group-size", type=int, default=16, help="2 groups of this size per batch")
    parser.add_argument("--num-steps", type=int, default=20, help="sampling steps per trajectory")
    parser.add_argument("--steps", type=int, default=3, help="training steps per fit (the first is not timed)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved fits per configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: no OpenMP oversubscription)")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_throughput:
            bench_throughput(args, Path(tmp))
        bench_overlap(args, Path(tmp))


if __name__ == "__main__":
    main()
