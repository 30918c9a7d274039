"""``python -m flowrl predict``: the PNGs it writes are ``BaseModule.generate``'s images for the same prompts and seeds,
from a LoRA or a fully fine-tuned fit checkpoint of the embedded model and from an exported LoRA folder, with the
reward callbacks' scores; bad options fail together before any weight loads."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.callbacks.image_writer import image_name
from flowrl.checkpoints.loading import load_policy
from flowrl.cli import main
from flowrl.methods import FlowGRPO
from flowrl.policies.export import export_lora
from flowrl.rewards import DigitAlignment

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, SEEDS, STEPS = ["red 3 and blue 7", "green 1 and blue 4"], [5, 9], 4


def quickstart_fit(out: Path, *extra: str) -> Path:
    """A 2-step quickstart run with a large learning rate (so the trained images differ visibly); its last.ckpt."""
    main(["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.max_steps=2", "--trainer.logger=false",
          f"--trainer.default_root_dir={out}", "--trainer.enable_progress_bar=false", "--data.num_groups=2",
          "--data.group_size=2", "--data.val_prompts=[red 3 and blue 7]",
          *extra])
    return next(out.rglob("last.ckpt"))


def written(folder: Path, prompts=PROMPTS, seeds=SEEDS) -> torch.Tensor:
    """The PNGs of a predict folder in row order, ``[N, 3, H, W]`` uint8."""
    names = [image_name(i * len(seeds) + j, p, s) for i, p in enumerate(prompts) for j, s in enumerate(seeds)]
    return torch.stack([torch.from_numpy(np.array(Image.open(folder / n))).permute(2, 0, 1) for n in names])


def as_png_pixels(images: torch.Tensor) -> torch.Tensor:
    return (images.clamp(0, 1) * 255).round().to(torch.uint8)


def rows() -> tuple[list[str], torch.Tensor]:
    return [p for p in PROMPTS for _ in SEEDS], torch.tensor(SEEDS * len(PROMPTS))


@pytest.mark.parametrize("finetuning", ["lora", "full"])
def test_predict_writes_the_images_generate_draws_from_the_checkpoint(finetuning, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    extra = ["--model.init_args.optimizer.init_args.lr=0.05"] if finetuning == "lora" else [
        "--model.init_args.policy.init_args.lora=null", "--model.init_args.optimizer.init_args.lr=0.002"]
    ckpt = quickstart_fit(tmp_path / "run", *extra)
    out = tmp_path / "predicted"
    main(["predict", "--ckpt_path", str(ckpt), "--prompts", *PROMPTS, "--seeds", *map(str, SEEDS),
          "--num_steps", str(STEPS), "--out", str(out)])
    assert f"-> {out}" in capsys.readouterr().out

    prompts, seeds = rows()
    trained = FlowGRPO(load_policy(ckpt), guidance_scale=1.0)  # the quickstart's base samples without CFG
    expected = trained.generation.generate(prompts, seeds, STEPS)
    assert torch.equal(written(out), as_png_pixels(expected))
    from flowrl.policies import TinyFlowPolicy

    base = FlowGRPO(TinyFlowPolicy("flowrl/tiny-digits-gd3", lora=None).load(), guidance_scale=1.0)
    base = base.generation.generate(prompts, seeds, STEPS)
    assert not torch.equal(as_png_pixels(base), as_png_pixels(expected))  # the checkpoint's weights were used

    with open(out / "scores.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["prompt"], int(r["seed"])) for r in table] == list(zip(prompts, seeds.tolist()))
    scores = DigitAlignment().load("cpu").score(expected, prompts)
    torch.testing.assert_close(torch.tensor([float(r["digit_alignment"]) for r in table]), scores.float(),
                               atol=1e-5, rtol=0)
    grid = Image.open(out / "grid.png")
    assert grid.width == len(SEEDS) * 128  # one column per seed, one prompt per row


def test_predict_ema_draws_with_the_average_the_checkpoint_keeps(tmp_path, monkeypatch):
    # a quickstart checkpoint (its EMA updated once in 2 steps) whose trained LoRA weights are then moved away from the
    # average, as the last step's weights differ from an average over several: --ema must draw the average
    monkeypatch.chdir(ROOT)
    fitted = quickstart_fit(tmp_path / "run", "--model.init_args.optimizer.init_args.lr=0.05")
    checkpoint = torch.load(fitted, weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("EMA")]
    for name in checkpoint["callbacks"][key]["shadow"]:
        checkpoint["state_dict"][name] = checkpoint["state_dict"][name] + 0.05
    ckpt = fitted.parent / "moved.ckpt"
    torch.save(checkpoint, ckpt)
    drawn = {}
    for ema in (False, True):
        main(["predict", "--ckpt_path", str(ckpt), "--prompts", *PROMPTS, "--seeds", *map(str, SEEDS), "--num_steps",
              str(STEPS), "--out", str(tmp_path / f"ema{ema}"), *(["--ema"] if ema else [])])
        drawn[ema] = written(tmp_path / f"ema{ema}")
    prompts, seeds = rows()
    for ema in (False, True):
        module = FlowGRPO(load_policy(ckpt, ema=ema), guidance_scale=1.0)
        assert torch.equal(drawn[ema], as_png_pixels(module.generation.generate(prompts, seeds, STEPS))), ema
    assert not torch.equal(drawn[True], drawn[False])  # the average is not the trained weights

    del checkpoint["callbacks"][key]
    torch.save(checkpoint, fitted.parent / "no_average.ckpt")
    with pytest.raises(SystemExit, match="--ema: --ema needs the state of exactly one flowrl.callbacks.EMA"):
        main(["predict", "--ckpt_path", str(fitted.parent / "no_average.ckpt"), "--prompts", "a", "--ema"])


def test_predict_from_an_exported_lora_folder(tmp_path, monkeypatch):
    from tests.policies.test_export import trained_policy
    from tests.policies.tiny_pipelines import save_pipeline, sd3_components
    from diffusers import StableDiffusion3Pipeline

    monkeypatch.chdir(tmp_path)
    model = str(save_pipeline(StableDiffusion3Pipeline, sd3_components, tmp_path / "sd3"))
    policy = trained_policy("sd3", model)
    export_lora(policy, tmp_path / "lora")
    prompts, seeds = ["a red cat", "a blue dog"], [1, 2]
    main(["predict", "--config", str(ROOT / "tests/policies/fit_pipeline.yaml"), "--lora", str(tmp_path / "lora"),
          f"--model.init_args.policy.init_args.model={model}", "--prompts", *prompts, "--seeds", "1", "2",
          "--num_steps", "3", "--guidance_scale", "3.0", "--out", str(tmp_path / "out")])
    expected = FlowGRPO(policy, guidance_scale=3.0).generation.generate([p for p in prompts for _ in seeds],
                                                              torch.tensor(seeds * 2), 3)
    assert torch.equal(written(tmp_path / "out", prompts, seeds), as_png_pixels(expected))
    from flowrl.policies import SD3Policy

    base = FlowGRPO(SD3Policy(model, lora=None, resolution=32, max_sequence_length=8).load(), guidance_scale=3.0)
    other = base.generation.generate([p for p in prompts for _ in seeds], torch.tensor(seeds * 2), 3)
    assert not torch.equal(as_png_pixels(other), as_png_pixels(expected))


def test_predict_option_errors_are_reported_together(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as err:
        main(["predict", "--ckpt_path", str(tmp_path / "run.ckpt"), "--lora", str(tmp_path / "empty"),
              "--prompts", "a", "--prompt_file", str(tmp_path / "missing.txt"), "--num_steps", "0"])
    message = str(err.value)
    for expected in (f"--ckpt_path '{tmp_path / 'run.ckpt'}' does not exist", "--lora and --ckpt_path are two ways",
                     "no pytorch_lora_weights.safetensors", "--prompts and --prompt_file are alternatives",
                     "missing.txt does not exist", "--num_steps 0"):
        assert expected in message
    with pytest.raises(SystemExit, match="give --ckpt_path"):
        main(["predict", "--prompts", "a"])
    with pytest.raises(SystemExit, match="--ema reads the average a fit checkpoint keeps; give --ckpt_path"):
        main(["predict", "--config", str(ROOT / "configs/quickstart.yaml"), "--ema", "--prompts", "a"])


def test_predict_prompt_file_that_is_missing_fails_before_loading(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = ["--config", str(ROOT / "configs/quickstart.yaml")]
    with pytest.raises(SystemExit, match="do not exist"):  # the policy path is bogus: checked before it would load
        main(["predict", *config, "--data.predict_prompts", str(tmp_path / "nope.txt"),
              "--model.init_args.policy.init_args.model=/nonexistent/model"])
