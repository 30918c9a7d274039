"""Every video config of configs/ runs a 2-step ``python -m flowrl fit`` with a tiny Wan pipeline swapped in (CPU,
float32, 32 px, 9 frames, cheap rewards): on-policy log-prob recompute (ratio 1) through Wan 2.2's two experts,
frame-reduced and clip-level rewards logged, sample strips and animations written; an image-to-video fit from prompt
records with first frames; and 2 FSDP2 processes equal 1 on a two-expert video config."""

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from flowrl.cli import main
from tests.cli.no_weights import Built, stop_when_built
from tests.cli.test_fit import assert_two_ranks_equal_one
from tests.test_prompt_records import png
from tests.two_process_group import GROUP, module_folder

ROOT = Path(__file__).resolve().parents[2]
#: every video config of configs/ (test_shipped_configs.py leaves them here) and the tiny pipeline it runs on
CONFIGS = {"wan21_flow_grpo": "wan21", "wan22_flow_grpo": "wan22", "wan_i2v_flow_grpo": "wan21_i2v",
           "wan21_tempflow_grpo": "wan21"}
#: video configs checked here before loading only: on one process this file's shrink makes wan21_flow_grpo of the
#: context-parallel config, whose split fit is tests/policies/test_wan_context_parallel_fit.py's
SPLIT = {"wan21_flow_grpo_cp": "wan21"}
#: video configs fitted by the test of their reward, with a tiny judge in place of the cheap rewards used here
FITTED_WITH_THEIR_REWARD = {"wan21_videoreward_flow_grpo": "tests/rewards/test_video_judges.py"}
#: video configs whose options do not survive this file's 3-step shrink (Flash-GRPO's pool lists the 10 steps it
#: draws from): built with weights refused by tests/cli/test_every_config_builds.py, their method fitted on the tiny Wan
#: by tests/policies/test_every_method.py (flash_grpo x wan)
CHECKED_AS_SHIPPED = {"wan21_flash_grpo": "tests/cli/test_every_config_builds.py"}


def test_every_video_config_is_covered():
    assert sorted(p.stem for p in (ROOT / "configs").glob("wan*.yaml")) == sorted([*CONFIGS, *SPLIT,
                                                                                 *FITTED_WITH_THEIR_REWARD,
                                                                                 *CHECKED_AS_SHIPPED])


def samples_per_rollout(config: str, overrides: dict) -> int:
    """The samples one rollout of the config's method scores (a tree's leaves), with ``overrides`` applied."""
    from flowrl.cli.config_checks import method_without_policy

    cfg = yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())["model"]
    method = _class(cfg["class_path"])
    init = {k: v for k, v in {**cfg["init_args"], **overrides}.items() if "${" not in str(v)}  # the run resolves those
    return method_without_policy(method, init).rollout_cost()[0]


def _class(path: str):
    module, _, name = path.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def tiny_overlay(out: Path, model_dir: str, config: str) -> Path:
    """A config layer that swaps in the tiny pipeline and a CPU-sized run (the config's method options stay)."""
    i2v = config == "wan_i2v_flow_grpo"
    prompts = ["a red cat", "a blue dog", "a green tree"]
    if i2v:  # prompt records with a first frame each
        for i in range(3):
            png(out / f"frames/{i}.png", 60 * i + 30, size=(40, 32))
        (out / "p.jsonl").write_text("\n".join(json.dumps({"prompt": p, "images": [f"frames/{i}.png"]})
                                               for i, p in enumerate(prompts)))
    tree = config == "wan21_tempflow_grpo"
    policy = {"model": model_dir, "height": 32, "width": 32, "num_frames": 9,
              "max_sequence_length": 512 if i2v else 16, "torch_dtype": "float32", "autocast": None,
              "gradient_checkpointing": True, "lora": {"rank": 4, "alpha": 8},
              # Wan 2.2: shift 3 puts the trained steps, t = 999 and 857 of (999, 857, 600), on both experts (875)
              **({"flow_shift": 3.0} if config == "wan22_flow_grpo" else {})}
    method = {"num_steps": 3, "eval_num_steps": 2, "num_minibatches": 1, "micro_batch_size": 4,
              "sample_chunk_size": None, "check_ratio": True, "check_ratio_threshold": 1.0e-5,
              **({"branches": 2, "tree_chunk_size": None} if tree else {})}
    leaves = samples_per_rollout(config, method)  # group_size counts samples per prompt: one tree's leaves
    layer = {
        "trainer": {"accelerator": "cpu", "devices": 1, "strategy": "auto", "max_steps": 2, "limit_val_batches": 0,
                    "enable_progress_bar": False, "default_root_dir": str(out),
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(out), "name": "csv"}},
                    "callbacks": [{"class_path": "flowrl.rewards.JpegIncompressibility"},
                                  {"class_path": "flowrl.rewards.TemporalConsistency", "init_args": {"size": 8}},
                                  {"class_path": "flowrl.callbacks.SampleGrid",
                                   "init_args": {"every_n_steps": 1, "num_images": 2}},
                                  {"class_path": "tests.cli.dump_outputs.DumpOutputs",
                                   "init_args": {"out": str(out / "dump")}}]},
        "model": {"init_args": {"policy": {"init_args": policy}, **method}},
        "data": {"prompts": str(out / "p.jsonl") if i2v else prompts, "num_groups": 2,
                 "group_size": leaves if tree else 2}}
    path = out / "tiny.yaml"
    path.write_text(yaml.safe_dump(layer))
    return path


@pytest.mark.parametrize("config", sorted({**CONFIGS, **SPLIT}))
def test_each_video_config_passes_the_checks_before_loading_as_shipped(wan_dirs, tmp_path, monkeypatch, config):
    stop_when_built(monkeypatch, {})  # the run is built, every weight load refused
    # the machine the config is for: its GPUs (the check that refuses a GPU config here has its own test)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    model = wan_dirs[{**CONFIGS, **SPLIT}[config]]
    prompts = str(tiny_overlay(tmp_path, model, config).parent / "p.jsonl") \
        if config == "wan_i2v_flow_grpo" else "[a red cat, a blue dog]"
    with pytest.raises(Built):  # a SystemExit here is a problem the checks found: its text names it
        main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), f"--data.prompts={prompts}",
              f"--model.init_args.policy.init_args.model={model}",
              f"--trainer.default_root_dir={tmp_path}"])


def logged(out: Path) -> dict:
    rows = list(csv.DictReader(open(next(out.rglob("metrics.csv")))))
    return {k: float(v) for row in rows for k, v in row.items() if v}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_each_video_config_fits_two_steps_on_the_tiny_model(wan_dirs, tmp_path, config):
    out = tmp_path / config
    out.mkdir()
    main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"),
          "--config", str(tiny_overlay(out, wan_dirs[CONFIGS[config]], config))])
    metrics = logged(out)
    assert metrics["train/check_ratio_max_dev"] < 1e-5  # the update recomputes the sampled log-probs: ratio 1
    assert 0 < metrics["train/reward/temporal_consistency"] <= 1 and "train/reward/jpeg_incompressibility" in metrics
    samples = next(out.rglob("samples"))
    assert {p.suffix for p in samples.iterdir()} == {".png", ".gif"}
    moved = {k.split(".")[1] for k, v in torch.load(out / "dump/weights.pt").items() if "lora_B" in k and v.any()}
    assert moved == ({"transformer", "transformer_2"} if config == "wan22_flow_grpo" else {"transformer"})


def two_process_fits(folder: Path, models: dict) -> tuple[list[list[str]], list[list[str]]]:
    """The two-expert config's 1-process fit and its 2-process FSDP2 fit (``tests/two_process_group.py``)."""
    config = ROOT / "configs" / "wan22_flow_grpo.yaml"
    common = ["--trainer.max_steps=1", "--model.init_args.optimizer=torch.optim.SGD",
              "--model.init_args.optimizer.lr=1.0", "--model.init_args.max_grad_norm=null",
              "--model.init_args.micro_batch_size=1", "--trainer.callbacks+=tests.cli.dump_outputs.DumpOutputs"]
    runs = []
    for name, extra in (("one", []), ("two", ["--trainer.devices=2", "--trainer.strategy=fsdp2"])):
        out = folder / name
        out.mkdir(parents=True)
        overlay = tiny_overlay(out, models["wan"]["wan22"], "wan22_flow_grpo")
        runs.append(["fit", "--config", str(config), "--config", str(overlay), *common,
                     f"--trainer.callbacks.out={out}/dump", *extra])
    return runs[:1], runs[1:]


@GROUP
def test_fsdp2_two_processes_equal_one_on_the_two_expert_config(two_process_fits):
    folder = module_folder(two_process_fits, __name__)
    one = assert_two_ranks_equal_one(folder / "one", folder / "two")
    assert one["advantages"].abs().sum() > 0
    weights = torch.load(folder / "two/dump/weights.pt")
    moved = {k.split(".")[1] for k, v in weights.items() if "lora_B" in k and v.abs().sum() > 0}
    assert moved == {"transformer", "transformer_2"}  # both experts trained, sharded over the two ranks


def test_the_docs_worked_example_runs(wan_dirs, tmp_path):
    main(["fit", "--config", str(ROOT / "configs/wan21_flow_grpo.yaml"),
          "--config", str(ROOT / "docs/data/video/tiny_cpu.yaml"),
          f"--model.init_args.policy.init_args.model={wan_dirs['wan21']}", f"--trainer.default_root_dir={tmp_path}",
          f"--trainer.logger.init_args.save_dir={tmp_path}"])
    metrics = logged(tmp_path)
    assert metrics["train/check_ratio_max_dev"] < 1e-5 and 0 < metrics["train/reward/temporal_consistency"] < 1
    assert sorted(p.name for p in next(tmp_path.rglob("samples")).iterdir()) == [
        "step_000000.gif", "step_000000.png", "step_000001.gif", "step_000001.png"]


def test_video_sizes_the_model_cannot_hold_are_reported_once_before_loading(wan_dirs, tmp_path, refuse_weights):
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(ROOT / "configs/wan21_flow_grpo.yaml"), "--data.prompts=[a red cat, a blue dog]",
              f"--model.init_args.policy.init_args.model={wan_dirs['wan21']}", f"--trainer.default_root_dir={tmp_path}",
              "--model.init_args.policy.init_args.num_frames=8", "--model.init_args.policy.init_args.height=40"])
    message = str(err.value)  # the CLI's list of problems: not a traceback, nor jsonargparse's dump of every type
    assert message.startswith("flowrl: invalid configuration:"), message
    assert message.count("model.init_args.policy.init_args.num_frames=8 must be 1 + a multiple of 4 (the VAE "
                         "compresses 4 frames into one latent frame), e.g. 5 or 9") == 1, message
    assert "model.init_args.policy.init_args.height=40 must be a positive multiple of 16" in message, message
