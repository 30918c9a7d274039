"""Helpers of the TDM-R1 and DiffusionNFT tests: a shipped tiny config shrunk to seconds, a resume comparison, and a
tiny SD3 pipeline fit whose checkpoint the export command turns into diffusers LoRA weights."""

from pathlib import Path

import pytest
import torch
from diffusers import StableDiffusion3Pipeline

from flowrl.cli import main
from flowrl.methods import BaseModule
from flowrl.checkpoints.loading import load_policy
from flowrl.sampling.sampler import seeded_noise
from tests.cli.test_fit import load_steps

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = "[red 1 and blue 2, green 3 and red 4, blue 5 and green 6, red 7 and red 8]"
CHECKPOINTS = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
               "--trainer.callbacks.every_n_train_steps=2", "--trainer.callbacks.save_top_k=-1"]


def shrunk(config: str, out: Path, *extra: str, model_dir: str = None) -> list[str]:
    """``fit`` of ``configs/<config>`` in seconds: 2 steps of 2 prompts x 4 samples, no logger, one validation prompt,
    DumpOutputs into ``out/dump``; ``model_dir``: a random-weight tiny model with LoRA rank 4 instead of the
    embedded one."""
    model = [f"--model.init_args.policy.init_args.model={model_dir}",
             "--model.init_args.policy.init_args.lora={rank: 4, alpha: 8}"] if model_dir else []
    return ["fit", "--config", str(ROOT / "configs" / config), *model, f"--trainer.default_root_dir={out}",
            "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.max_steps=2",
            "--data.num_groups=2", "--data.group_size=4", f"--data.prompts={PROMPTS}",
            "--data.val_prompts=[red 1 and blue 2, green 3 and red 4]", *extra,
            "--trainer.callbacks+=tests.cli.dump_outputs.DumpOutputs", f"--trainer.callbacks.out={out}/dump"]


def option_errors(config: str, tmp_path: Path, *options: str) -> str:
    """The error of a ``fit`` of ``configs/<config>`` (run from the repository) with ``options``, whose model path
    does not exist either: the option checks must answer before anything loads."""
    with pytest.raises(SystemExit) as raised:
        main(["fit", "--config", f"configs/{config}", f"--model.init_args.policy.init_args.model={tmp_path}/no",
              *options])
    return str(raised.value)


def assert_resume_is_exact(args, out: Path, adapters: tuple[str, ...]) -> dict:
    """4 straight optimizer steps equal 2 steps, a checkpoint holding every adapter, and 2 resumed steps: the same
    samples, rewards, advantages and final weights of every adapter. Returns the checkpoint. It resumes from the
    straight run's own step-2 checkpoint: the one a run stopped at step 2 writes (the batch ends both)."""
    main(args(out / "straight", "--trainer.max_steps=4", *CHECKPOINTS))
    saved = next(Path(out / "straight").rglob("*step=2.ckpt"))
    checkpoint = torch.load(saved, weights_only=False)
    held = {name for name in adapters if any(f".{name}." in k for k in checkpoint["state_dict"])}
    assert held == set(adapters), f"the checkpoint holds {held}, not every adapter {adapters}"
    main(args(out / "resumed", "--trainer.max_steps=4", f"--ckpt_path={saved}"))
    straight, resumed = load_steps(out / "straight"), load_steps(out / "resumed")
    assert 0 < len(resumed) < len(straight) and sorted(resumed) == sorted(straight)[-len(resumed):]  # later batches
    for key in resumed:
        for field in ("seeds", "rewards", "advantages"):
            assert torch.equal(straight[key][field], resumed[key][field]), (key, field)
    ws, wr = torch.load(out / "straight/dump/weights.pt"), torch.load(out / "resumed/dump/weights.pt")
    assert {name for name in adapters if any(f".{name}." in k for k in ws)} == set(adapters)
    assert sorted(ws) == sorted(wr) and all(torch.equal(ws[k], wr[k]) for k in ws)
    return checkpoint


def sd3_fit_config(tmp_path: Path, sd3_dir: str, method: str, options: str) -> Path:
    """A one-step fit of ``method`` (with YAML ``options`` under init_args) on the tiny SD3 pipeline."""
    config = tmp_path / "sd3.yaml"
    config.write_text(f"""seed_everything: 3
trainer:
  accelerator: cpu
  max_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  limit_val_batches: 0
  default_root_dir: {tmp_path}/run
  logger: {{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {{save_dir: {tmp_path}/run, name: csv}}}}
  callbacks:
    - class_path: flowrl.rewards.JpegIncompressibility
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
model:
  class_path: {method}
  init_args:
    policy:
      class_path: flowrl.policies.SD3Policy
      init_args: {{model: {sd3_dir}, resolution: 32, max_sequence_length: 8, lora: {{rank: 4, alpha: 8}}}}
    num_steps: 3
    seed: 3
    optimizer: {{class_path: torch.optim.SGD, init_args: {{lr: 2.0}}}}
{options}
data:
  prompts: [a red cat, a blue dog, a green tree, a photo of a cat]
  group_size: 2
  num_groups: 2
  seed: 3
""")
    return config


def assert_export_matches_pipeline(tmp_path: Path, sd3_dir: str, method: str, options: str,
                                   adapters: list[str], fitted: bool = False) -> None:
    """A one-step fit of ``method`` on the tiny SD3 pipeline, exported: the checkpoint's policy holds ``adapters``
    with ``default`` active, its CFG-free images differ from the backbone's, and the plain diffusers pipeline with
    the exported LoRA draws the same images from the sampler's initial noise. ``fitted``: the fit of
    :func:`sd3_fit_config` in ``tmp_path`` ran already (a multi-process one, elsewhere)."""
    if not fitted:
        main(["fit", "--config", str(sd3_fit_config(tmp_path, sd3_dir, method, options))])
    ckpt = next(Path(tmp_path / "run").rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "lora")])
    policy = load_policy(ckpt)
    assert policy.adapter_names == adapters and policy.active_adapter == "default"
    prompts, seeds = ["a red cat", "a blue dog"], torch.tensor([11, 12])
    ours = BaseModule(policy, num_steps=3, guidance_scale=1.0).generation.generate(prompts, seeds, 3)
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    noise = seeded_noise(seeds, policy.latent_shape(), 1)[:, 0]
    run = lambda: pipe(prompts, num_inference_steps=3, guidance_scale=1.0, latents=noise, height=32,  # noqa: E731
                       width=32, output_type="pt", max_sequence_length=8).images
    base = run()
    pipe.load_lora_weights(tmp_path / "lora")
    assert (base - ours).abs().max() > 1e-4  # the trained policy differs from the backbone
    torch.testing.assert_close(run(), ours, atol=1e-5, rtol=1e-4)
