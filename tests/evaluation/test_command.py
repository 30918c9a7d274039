"""``evaluate``'s options are checked before any weight loads, and every problem is reported at once, naming the
option and the fix: a missing checkpoint, checkpoints of different base models, a bad suite file, bad names, a
held-out metric that is not a reward, a feature space no metric provides."""

import shutil
from pathlib import Path

import pytest
import torch
import yaml

import flowrl.evaluation.models as models
from flowrl.cli import main

ROOT = Path(__file__).resolve().parents[2]


def fake_run(folder: Path, model: str) -> Path:
    """A run folder whose config trains the tiny policy on ``model``, with a (weightless) checkpoint: enough for every
    check, which reads configs and never the weights."""
    config = yaml.safe_load((ROOT / "tests/evaluation/fit_brightness.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"]["model"] = model
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    torch.save({"state_dict": {}}, folder / "checkpoints" / "last.ckpt")
    return folder / "checkpoints" / "last.ckpt"


@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights loaded before the options were checked")

    monkeypatch.setattr(models, "load_models", refuse)


def problems(args: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", *args])
    return str(exit_.value)


def test_every_problem_at_once_before_any_weight_loads(tmp_path, tiny_model_dir, no_weights, monkeypatch):
    monkeypatch.chdir(ROOT)
    same = fake_run(tmp_path / "same", "flowrl/tiny-digits")
    other = fake_run(tmp_path / "other", tiny_model_dir)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "red 3 and blue 7"}\n{"prompt": 3}\n')
    message = problems(["--ckpt_path", f"a={same}", f"b={other}", f"c={tmp_path / 'missing.ckpt'}",
                        f"base={same}", "--suite", str(tmp_path / "bad.jsonl"), "--held_out",
                        "flowrl.callbacks.SampleGrid", "--seeds", "1", "1"])
    lines = message.splitlines()
    assert lines[0] == "flowrl evaluate: invalid options:"
    expected = ["--seeds 1 1: each seed once",
                "--ckpt_path base=...: 'base' is the model without trained weights",
                f"--ckpt_path c={tmp_path / 'missing.ckpt'} does not exist (relative paths start at",
                f"--ckpt_path b={other}: trained TinyFlowPolicy on {Path(tiny_model_dir).resolve()}, but the base",
                f"{tmp_path / 'bad.jsonl'}, line 2: needs a non-empty \"prompt\" string",
                "--held_out flowrl.callbacks.SampleGrid is not a reward callback class"]
    for text in expected:
        assert any(text in line for line in lines), (text, message)
    assert len(lines) == 1 + len(expected), message
    assert "evaluate models of one base together" in message  # the fix, named


def test_a_run_without_its_config_and_a_folder_that_is_neither(tmp_path, no_weights, monkeypatch):
    monkeypatch.chdir(ROOT)
    ckpt = fake_run(tmp_path / "run", "flowrl/tiny-digits")
    (tmp_path / "run" / "config.yaml").unlink()
    (tmp_path / "empty").mkdir()
    message = problems(["--ckpt_path", str(ckpt), f"x={tmp_path / 'empty'}"])
    assert f"--ckpt_path tuned={ckpt}: no config.yaml beside it or in its run folder; pass the run's config with " \
           "--config" in message
    assert f"--ckpt_path x={tmp_path / 'empty'}: a folder with neither pytorch_lora_weights.safetensors" in message
    (tmp_path / "cut.ckpt").write_bytes(b"")
    message = problems(["--ckpt_path", f"y={tmp_path / 'cut.ckpt'}", "--config", str(ROOT / "configs/quickstart.yaml")])
    assert f"--ckpt_path y={tmp_path / 'cut.ckpt'}: is empty (0 bytes: a save that was cut off); pass a fit" in message
    assert "give --config" not in message  # the problems above say what is wrong; no second, vaguer line


def test_a_suite_is_needed_and_features_must_exist(tmp_path, no_weights, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's data.val_prompts is relative to the repository: not found here
    config = tmp_path / "config.yaml"
    shutil.copy(ROOT / "tests/evaluation/fit_brightness.yaml", config)
    message = problems(["--config", str(config), "--features", "brightness"])
    assert "--suite configs/prompts/digits_val.txt does not exist" in message
    assert "--features brightness: that metric has no image_features(images) method" in message
    message = problems(["--config", str(config), "--suite", "digits", "--features", "nope"])
    assert "--suite digits: no suite of that name; named suites: digits_val" in message
    assert "--features nope: no metric of that name; give auto, none, or one of ['brightness']" in message


@pytest.mark.parametrize("config, steps_and_guidance", [("tiny_tdm_r1.yaml", (4, 1.0)),
                                                        ("tiny_diffusion_nft.yaml", (10, 1.0))])
def test_steps_and_guidance_default_to_the_methods_own(config, steps_and_guidance, tmp_path, no_weights,
                                                         monkeypatch):
    """A config that leaves them out evaluates as its run sampled: TDM-R1's 4 CFG-free steps, DiffusionNFT's CFG-free
    sampler (their declared defaults), not another method's 10 steps at guidance 4.5."""
    from flowrl.cli.evaluate import parser, plan

    monkeypatch.chdir(ROOT)
    spec = yaml.safe_load((ROOT / "configs" / config).read_text())
    for key in ("num_steps", "eval_num_steps", "guidance_scale"):
        spec["model"]["init_args"].pop(key, None)
    (tmp_path / config).write_text(yaml.safe_dump(spec))
    found, wrong = plan(parser().parse_args(["--config", str(tmp_path / config), "--suite", "digits_val"]))
    assert wrong == [] and (found.num_steps, found.guidance_scale) == steps_and_guidance
    assert found.prompts_per_batch == 16 // 4  # data.val_batch_size's default, 16 images, over the 4 default seeds
