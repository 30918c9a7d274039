"""bf16 training steps of each pipeline adapter on one GPU: step time and peak memory, through ``flowrl fit``.

    python scripts/bench_gpu.py [--models sd3 flux sd15 sd35m sd35m_ckpt sd35m_both qwen_image flux2_klein4b wan21
        wan21_ckpt] [--steps 4] [--json results.json] [--tiny] [--workdir DIR]

Each model is built from a config with random weights (the tests' tiny SD3, FLUX.1 and SD1.5 pipelines; ``sd35m``:
SD3.5-Medium's transformer at full width and depth, 2.2B parameters, with tiny CLIP encoders, no T5 and a small VAE;
``qwen_image`` (20.4B, 512 px), ``flux2_klein4b`` (FLUX.2 [klein] 4B base, 3.9B, 512 px) and ``wan21`` /
``wan21_ckpt`` (Wan 2.1 T2V 1.3B, 480 x 832 px x 33 frames, without and with gradient checkpointing): the published
transformer configs of ``scripts/count_parameters.py`` at full size with narrow stand-in encoders and VAEs,
``scripts/gpu_pipelines.py``), saved with ``save_pretrained`` and trained for a few optimizer steps by
``flowrl.cli.main`` (the code path of ``python -m flowrl fit``): one Flow-GRPO step is the rollout (T=10, CFG as the
family does it: the empty prompt batched with the prompts), the rewards, the PPO pass with its backward over every
trained step, and the optimizer step; frozen weights in bfloat16, the networks under bf16 autocast, LoRA (each
family's shipped config's rank and targets), JPEG incompressibility as the reward, ``check_ratio`` on. A callback
synchronises the GPU around every training step and reads ``torch.cuda.max_memory_allocated``. The first step
(kernel selection, prompt cache, the on-policy check's extra pass) is printed apart from the median of the others.
A model that runs out of GPU memory is reported as such and the next one runs. ``--tiny`` runs the new families on
the tests' tiny pipelines at tiny sizes (with ``--accelerator cpu``: the smoke test of the script).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from lightning.pytorch import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' pipeline builders

from flowrl.cli import main as flowrl  # noqa: E402

RESULTS: dict[str, dict] = {}
#: the SD entries (``sd35m_both``: SD3.5-M with cfg_gradient both, beside ``sd35m``'s Flow-GRPO default cond)
SD_MODELS = ("sd3", "flux", "sd15", "sd35m", "sd35m_ckpt", "sd35m_both")


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
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextModelWithProjection

    from scripts.count_parameters import build_transformer

    from tests.policies.tiny_pipelines import clip_config, clip_tokenizer

    tokenizer = clip_tokenizer()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # 2B parameters initialise slowly on a CPU
        transformer = build_transformer("sd35_medium", num_layers=num_layers,  # the published config
                                        dual_attention_layers=tuple(range(min(13, num_layers)))).to(torch.bfloat16)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(16,) * 4,
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=1, norm_num_groups=4, sample_size=512, shift_factor=0.0609,
                        scaling_factor=1.5305, use_quant_conv=False, use_post_quant_conv=False)
    return {"transformer": transformer, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            "tokenizer": tokenizer, "tokenizer_2": clip_tokenizer(), "tokenizer_3": None,
            "text_encoder": CLIPTextModelWithProjection(clip_config(tokenizer, 16, projection=768)),
            "text_encoder_2": CLIPTextModelWithProjection(clip_config(tokenizer, 16, projection=1280)),
            "text_encoder_3": None}


def folder(name: str, tiny: bool) -> str:
    """The folder a model's pipeline is saved in (``sd35m`` and ``sd35m_ckpt`` share one, as ``wan21*`` do)."""
    if name in FAMILIES:
        return FAMILIES[name].builder + ("_tiny" if tiny else "")
    return "sd35m" if name.startswith("sd35m") else name


def build(name: str, root: Path, sd35m_layers: int = 24, tiny: bool = False) -> tuple[str, list[str]]:
    """Saves the model's pipeline under ``root``; returns its folder and the CLI overrides of its run."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    from tests.policies.tiny_pipelines import flux_components, save_pipeline, sd3_components
    from tests.policies.tiny_sd15 import save_sd15

    small = ["--model.init_args.num_steps=10", "--model.init_args.micro_batch_size=8",
             "--data.num_groups=4", "--data.group_size=4"]
    if name == "sd3":
        return str(save_pipeline(StableDiffusion3Pipeline, sd3_components, root / name)), small
    if name == "flux":
        path = save_pipeline(FluxPipeline, flux_components, root / name)
        return str(path), small + ["--model.init_args.policy.class_path=flowrl.policies.FluxPolicy"]
    if name == "sd15":
        return str(save_sd15(root / name)), small + [
            "--model.init_args.policy.class_path=flowrl.policies.SD15Policy",
            "--model.init_args.step_kind=ddim", "--model.init_args.noise_level=1.0"]
    if name.startswith("sd35m"):
        path = root / folder(name, tiny)
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
        if name.endswith("_both"):  # Flow-GRPO's default differentiates only the conditional half (cfg_gradient cond)
            args.append("--model.init_args.cfg_gradient=both")
        return str(path), args
    if name in FAMILIES:
        return build_family(name, root, tiny)
    raise ValueError(f"unknown model {name!r}: choose from {', '.join((*SD_MODELS, *FAMILIES))}")


@dataclass(frozen=True)
class FamilyRun:
    """A current family's bench entry: the shipped config whose policy settings the run takes (class, LoRA, dtypes,
    VAE chunking), the ``gpu_pipelines`` builder and diffusers pipeline class, and the policy and run options of the
    full-size run; ``tiny_policy`` and ``tiny_run`` replace them with ``--tiny``."""

    config: str
    builder: str
    pipeline: str
    policy: dict
    run: dict
    tiny_policy: dict = field(default_factory=lambda: {"resolution": 32, "max_sequence_length": 16})
    tiny_run: dict = field(default_factory=lambda: {"micro_batch_size": 2, "num_groups": 1, "group_size": 2})


def _wan(checkpointing: bool) -> FamilyRun:
    # 2 videos of 33 frames at 480 x 832 per step (9 x 30 x 52 = 14,040 tokens each), micro-batch 1 (2 rows with CFG)
    return FamilyRun("wan21_flow_grpo", "wan21_1b3", "WanPipeline",
                     {"height": 480, "width": 832, "num_frames": 33, "gradient_checkpointing": checkpointing},
                     {"guidance_scale": 4.5, "micro_batch_size": 1, "num_groups": 1, "group_size": 2},
                     {"height": 32, "width": 32, "num_frames": 9, "max_sequence_length": 16})


FAMILIES = {
    # 4 images per step, micro-batch 2 (4 rows with true CFG), gradient checkpointing as the config
    "qwen_image": FamilyRun("qwen_image_flow_grpo", "qwen_image", "QwenImagePipeline",
                            {"resolution": 512, "gradient_checkpointing": True},
                            {"guidance_scale": 4.0, "micro_batch_size": 2, "num_groups": 1, "group_size": 4}),
    # 8 images per step, micro-batch 4 (8 rows with CFG), as sd35m; 512 px (the config trains at 384); LoRA on the
    # policy's default targets (docs/models.md's 4B row)
    "flux2_klein4b": FamilyRun("flux2_klein_flow_grpo", "flux2_klein_4b", "Flux2KleinPipeline",
                               {"resolution": 512, "gradient_checkpointing": False,
                                "lora": {"rank": 64, "alpha": 128, "target_modules": None}},
                               {"guidance_scale": 4.0, "micro_batch_size": 4, "num_groups": 1, "group_size": 8}),
    "wan21": _wan(False),
    "wan21_ckpt": _wan(True),
}


def build_family(name: str, root: Path, tiny: bool) -> tuple[str, list[str]]:
    """Saves a ``FAMILIES`` model under ``root`` and returns its folder and the CLI arguments of its run: a config
    layer with the shipped config's policy at the bench's sizes, and the run options."""
    import diffusers
    import yaml

    from scripts import gpu_pipelines
    from tests.policies.tiny_pipelines import save_pipeline

    entry = FAMILIES[name]
    path = root / folder(name, tiny)
    if not path.exists():  # wan21 and wan21_ckpt share one
        save_pipeline(getattr(diffusers, entry.pipeline), lambda: getattr(gpu_pipelines, entry.builder)(tiny), path)
    shipped = yaml.safe_load((ROOT / "configs" / f"{entry.config}.yaml").read_text())["model"]["init_args"]["policy"]
    options = {**shipped["init_args"], **entry.policy, "model": str(path)}
    options["lora"] = {**shipped["init_args"]["lora"], **entry.policy.get("lora", {})}
    run = entry.run
    if tiny:
        options.update(entry.tiny_policy)
        options["lora"].update(rank=4, alpha=8)
        run = {**run, **entry.tiny_run}
    layer = root / f"{name}{'_tiny' if tiny else ''}.yaml"
    layer.write_text(yaml.safe_dump({"model": {"init_args": {"policy": {"class_path": shipped["class_path"],
                                                                        "init_args": options}}}}))
    return str(path), ["--config", str(layer), "--model.init_args.num_steps=" + ("3" if tiny else "10"),
                       f"--model.init_args.guidance_scale={run['guidance_scale']}",
                       f"--model.init_args.micro_batch_size={run['micro_batch_size']}",
                       f"--data.num_groups={run['num_groups']}", f"--data.group_size={run['group_size']}"]


def fit(name: str, path: str, overrides: list[str], root: Path, args) -> None:
    """One model's run through the CLI; running out of GPU memory is a result (the next model still runs)."""
    gc.collect()  # the saved pipeline's modules (a full-size transformer sits on the GPU while it is written)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        flowrl(["fit", "--config", str(ROOT / "tests/policies/fit_pipeline.yaml"),
                f"--model.init_args.policy.init_args.model={path}",
                "--model.init_args.policy.init_args.torch_dtype=bfloat16",
                "--model.init_args.policy.init_args.autocast=bfloat16",
                "--model.init_args.check_ratio_threshold=1.0e-2", "--model.init_args.timestep_fraction=0.99",
                f"--trainer.accelerator={args.accelerator}", f"--trainer.max_steps={args.steps}",
                f"--trainer.default_root_dir={root / 'runs' / name}",
                f"--trainer.logger.init_args.save_dir={root / 'runs' / name}", *overrides,
                "--trainer.callbacks+=scripts.bench_gpu.StepTimer", f"--trainer.callbacks.name={name}"])
    except torch.OutOfMemoryError as error:
        from scripts import bench_gpu

        bench_gpu.RESULTS[name] = {**bench_gpu.RESULTS.get(name, {}), "oom": str(error).splitlines()[0],
                                   "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    gc.collect()


def report(results: dict, args) -> None:
    device = torch.cuda.get_device_name() if args.accelerator == "gpu" else "CPU"
    print(f"{device}, torch {torch.__version__}, {args.steps} steps each")
    print(f"{'model':<15}{'params (M)':>11}{'LoRA (M)':>10}{'first (s)':>11}{'median (s)':>12}{'peak (GiB)':>12}"
          f"{'|ratio-1|':>11}")
    for name, r in results.items():
        if "oom" in r:
            print(f"{name:<15} out of GPU memory at {r['peak_gib']:.2f} GiB: {r['oom']}")
            continue
        print(f"{name:<15}{r['params_m']:>11.2f}{r['trainable_m']:>10.3f}{r['first_s']:>11.2f}{r['median_s']:>12.3f}"
              f"{r['peak_gib']:>12.2f}{r['ratio_dev']:>11.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sd3", "flux", "sd15", "sd35m", "sd35m_ckpt"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the results here (after every model)")
    parser.add_argument("--sd35m-layers", type=int, default=24, help="fewer for a smoke run")
    parser.add_argument("--tiny", action="store_true", help="the current families on the tests' tiny pipelines")
    parser.add_argument("--workdir", default=None, help="where the pipelines are written (Qwen-Image: 41 GB)")
    parser.add_argument("--accelerator", default="gpu", help="cpu: a smoke run of the script (tests), no timings")
    args = parser.parse_args()
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU (or --accelerator cpu for a smoke run)")
    if unknown := [m for m in args.models if m not in (*SD_MODELS, *FAMILIES)]:
        raise SystemExit(f"--models {unknown}: choose from {' '.join((*SD_MODELS, *FAMILIES))}")

    from scripts import bench_gpu  # the callback runs as scripts.bench_gpu, not as __main__

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        for i, name in enumerate(args.models):
            path, overrides = build(name, root, args.sd35m_layers, args.tiny)
            try:
                fit(name, path, overrides, root, args)
            finally:  # a run stopped by SIGTERM (a time limit) still reports the steps it measured
                report(bench_gpu.RESULTS, args)
            if folder(name, args.tiny) not in {folder(n, args.tiny) for n in args.models[i + 1:]}:
                shutil.rmtree(path, ignore_errors=True)  # the disk holds one full-size pipeline at a time


if __name__ == "__main__":
    main()
