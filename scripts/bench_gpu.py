"""bf16 training steps of each pipeline adapter on one GPU: step time and peak memory, through ``flowrl fit``.

    python scripts/bench_gpu.py [--models sd3 flux sd15 sd35m sd35m_ckpt] [--steps 4] [--json results.json]

Each model is built from a config with random weights (the tests' tiny SD3, FLUX.1 and SD1.5 pipelines; ``sd35m``:
SD3.5-Medium's transformer at full width and depth, 2.2B parameters, with tiny CLIP encoders, no T5 and a small VAE),
saved with ``save_pretrained`` and trained for a few optimizer steps by ``flowrl.cli.main`` (the code path of
``python -m flowrl fit``): frozen weights in bfloat16, the networks under bf16 autocast, LoRA, JPEG
incompressibility as the reward, ``check_ratio`` on. A callback synchronises the GPU around every training step
(rollout, rewards, PPO pass, optimizer step) and reads ``torch.cuda.max_memory_allocated``. The first step (kernel
selection, prompt cache) is printed apart from the median of the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' pipeline builders

from flowrl.cli import main as flowrl  # noqa: E402

RESULTS: dict[str, dict] = {}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(Callback):
    """Wall time of every training step with the GPU synchronised at both ends, and the peak allocated memory."""

    def __init__(self, name: str):
        self.name, self.times, self.start = name, [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        sync()
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        sync()
        self.times.append(time.perf_counter() - self.start)
        RESULTS[self.name] = {
            "first_s": self.times[0], "median_s": statistics.median(self.times[1:] or self.times),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"),
            "trainable_m": sum(p.numel() for p in pl_module.parameters() if p.requires_grad) / 1e6,
            "params_m": sum(p.numel() for n, p in pl_module.policy.denoiser.named_parameters() if "lora_" not in n) / 1e6,
            "ratio_dev": float(trainer.callback_metrics.get("train/check_ratio_max_dev", float("nan"))),
        }


def sd35_medium_components(num_layers: int = 24) -> dict:
    """SD3.5-Medium's transformer config (random weights) with tiny CLIP encoders whose pooled outputs have the real
    widths (768 + 1280 = 2048), no T5 (its part of the embedding is zeros) and a 4-block, 16-channel VAE (8x)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    from tests.policies.tiny_pipelines import clip_config, clip_tokenizer

    tokenizer = clip_tokenizer()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # 2B parameters initialise slowly on a CPU
        transformer = SD3Transformer2DModel(
            sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=num_layers, attention_head_dim=64,
            num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
            pos_embed_max_size=384, qk_norm="rms_norm", dual_attention_layers=tuple(range(min(13, num_layers))),
        ).to(torch.bfloat16)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(16,) * 4,
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=1, norm_num_groups=4, sample_size=512, shift_factor=0.0609,
                        scaling_factor=1.5305, use_quant_conv=False, use_post_quant_conv=False)
    return {"transformer": transformer, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            "tokenizer": tokenizer, "tokenizer_2": clip_tokenizer(), "tokenizer_3": None,
            "text_encoder": CLIPTextModelWithProjection(clip_config(tokenizer, 16, projection=768)),
            "text_encoder_2": CLIPTextModelWithProjection(clip_config(tokenizer, 16, projection=1280)),
            "text_encoder_3": None}


def build(name: str, root: Path, sd35m_layers: int = 24) -> tuple[str, list[str]]:
    """Saves the model's pipeline under ``root``; returns its folder and the CLI overrides of its run."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    from tests.policies.tiny_pipelines import flux_components, save_pipeline, sd3_components
    from tests.policies.tiny_sd15 import save_sd15

    tiny = ["--model.init_args.num_steps=10", "--model.init_args.micro_batch_size=8",
            "--data.num_groups=4", "--data.group_size=4"]
    if name == "sd3":
        return str(save_pipeline(StableDiffusion3Pipeline, sd3_components, root / name)), tiny
    if name == "flux":
        path = save_pipeline(FluxPipeline, flux_components, root / name)
        return str(path), tiny + ["--model.init_args.policy.class_path=flowrl.policies.FluxPolicy"]
    if name == "sd15":
        return str(save_sd15(root / name)), tiny + [
            "--model.init_args.policy.class_path=flowrl.policies.SD15Policy",
            "--model.init_args.step_kind=ddim", "--model.init_args.noise_level=1.0"]
    if name.startswith("sd35m"):
        path = root / "sd35m"
        if not path.exists():
            save_pipeline(StableDiffusion3Pipeline, lambda: sd35_medium_components(sd35m_layers), path)
        # Flow-GRPO's SD3.5-M settings at 512 px, T=10, LoRA r32, for one group of 8 per step
        args = ["--model.init_args.policy.init_args.resolution=512",
                "--model.init_args.policy.init_args.text_encoder_3=false",
                "--model.init_args.policy.init_args.max_sequence_length=77",
                "--model.init_args.policy.init_args.lora.rank=32", "--model.init_args.policy.init_args.lora.alpha=64",
                "--model.init_args.num_steps=10", "--model.init_args.guidance_scale=4.5",
                "--model.init_args.micro_batch_size=4", "--data.num_groups=1", "--data.group_size=8"]
        if name.endswith("_ckpt"):
            args.append("--model.init_args.policy.init_args.gradient_checkpointing=true")
        return str(path), args
    raise ValueError(f"unknown model {name!r}: choose from sd3, flux, sd15, sd35m, sd35m_ckpt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sd3", "flux", "sd15", "sd35m", "sd35m_ckpt"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--sd35m-layers", type=int, default=24, help="fewer for a smoke run")
    parser.add_argument("--accelerator", default="gpu", help="cpu: a smoke run of the script (tests), no timings")
    args = parser.parse_args()
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU (or --accelerator cpu for a smoke run)")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in args.models:
            path, overrides = build(name, root, args.sd35m_layers)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            flowrl(["fit", "--config", str(ROOT / "tests/policies/fit_pipeline.yaml"),
                    f"--model.init_args.policy.init_args.model={path}",
                    "--model.init_args.policy.init_args.torch_dtype=bfloat16",
                    "--model.init_args.policy.init_args.autocast=bfloat16",
                    "--model.init_args.check_ratio_threshold=1.0e-2", "--model.init_args.timestep_fraction=0.99",
                    f"--trainer.accelerator={args.accelerator}", f"--trainer.max_steps={args.steps}",
                    f"--trainer.default_root_dir={root / 'runs' / name}",
                    f"--trainer.logger.init_args.save_dir={root / 'runs' / name}", *overrides,
                    "--trainer.callbacks+=scripts.bench_gpu.StepTimer", f"--trainer.callbacks.name={name}"])
    from scripts import bench_gpu  # the callback ran as scripts.bench_gpu, not as __main__

    results = bench_gpu.RESULTS
    device = torch.cuda.get_device_name() if args.accelerator == "gpu" else "CPU"
    print(f"{device}, torch {torch.__version__}, {args.steps} steps each")
    print(f"{'model':<11}{'params (M)':>11}{'LoRA (M)':>10}{'first (s)':>11}{'median (s)':>12}{'peak (GiB)':>12}"
          f"{'|ratio-1|':>11}")
    for name, r in results.items():
        print(f"{name:<11}{r['params_m']:>11.2f}{r['trainable_m']:>10.3f}{r['first_s']:>11.2f}{r['median_s']:>12.3f}"
              f"{r['peak_gib']:>12.2f}{r['ratio_dev']:>11.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
