"""The LTX-2 configs of configs/ (``test_shipped_configs.py`` leaves them here): each passes the checks a real run makes
before loading, as shipped, with the tiny LTX-2 folder swapped in (image-to-video: with prompt records of one first
frame each); and the TempFlow-GRPO config with VideoAlign's
VideoReward fits one batch on the tiny LTX-2 with a tiny VideoReward judge in its place (CPU, float32, 32 px, 5
frames): a tree rollout scored by each of the judge's dimensions and an on-policy update of the video stream's LoRA."""

from pathlib import Path

import pytest
import torch
import yaml

from flowrl.cli import main
from tests.cli.no_weights import Built, stop_when_built
from tests.policies.edit_records import write_records
from tests.policies.test_wan_fit import logged, samples_per_rollout
from tests.policies.tiny_ltx2 import FRAME_RATE, FRAMES, HEIGHT, WIDTH

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["ltx2_flow_grpo", "ltx2_i2v_flow_grpo", "ltx2_videoreward_tempflow_grpo"]
PROMPTS = "[a red cat, a blue dog]"


def test_every_ltx2_config_is_here():
    assert sorted(p.stem for p in (ROOT / "configs").glob("ltx2*.yaml")) == CONFIGS


@pytest.mark.parametrize("config", CONFIGS)
def test_each_ltx2_config_passes_the_checks_before_loading_as_shipped(ltx2_dir, tmp_path, monkeypatch, config):
    stop_when_built(monkeypatch, {})  # the run is built, every weight load refused
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the machine the config is for
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    monkeypatch.setattr("diffusers.utils.is_av_available", lambda: True)  # image-to-video's H.264 first frame
    prompts = write_records(tmp_path / "data") if "i2v" in config else PROMPTS  # one first frame a record
    with pytest.raises(Built):  # a SystemExit here is a problem the checks found: its text names it
        main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), f"--data.prompts={prompts}",
              f"--model.init_args.policy.init_args.model={ltx2_dir}", f"--trainer.default_root_dir={tmp_path}"])


@pytest.fixture(scope="module")
def videoalign(tmp_path_factory):
    from flowrl.rewards.shared_judge import _JUDGES
    from tests.rewards.tiny_video_judges import qwen2_vl_base, videoalign_folder

    root = tmp_path_factory.mktemp("judge")
    yield videoalign_folder(root / "videoreward", qwen2_vl_base(root / "qwen2_vl"))
    _JUDGES.clear()


def test_the_videoreward_tree_config_fits_a_batch_on_the_tiny_ltx2(ltx2_dir, videoalign, tmp_path):
    from tests.rewards.tiny_video_judges import MIN_PIXELS

    config = "ltx2_videoreward_tempflow_grpo"
    shipped = yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())["trainer"]["callbacks"]
    judged = [c for c in shipped if c["class_path"] == "flowrl.rewards.VideoReward"]
    assert [c["init_args"]["dimension"] for c in judged] == ["VQ", "MQ", "TA"]
    method = {"num_steps": 2, "eval_num_steps": 2, "branches": 2, "tree_chunk_size": None, "num_minibatches": 1,
              "micro_batch_size": 4, "check_ratio": True, "check_ratio_threshold": 1.0e-5}
    judge = {"model": str(videoalign), "dtype": "float32", "min_pixels": MIN_PIXELS, "clip_fps": FRAME_RATE}
    layer = {
        "trainer": {"accelerator": "cpu", "devices": 1, "strategy": "auto", "max_steps": 1, "limit_val_batches": 0,
                    "enable_progress_bar": False, "default_root_dir": str(tmp_path),
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path), "name": "csv"}},
                    "callbacks": [{"class_path": c["class_path"], "init_args": {**c["init_args"], **judge}}
                                  for c in judged] + [{"class_path": "tests.cli.dump_outputs.DumpOutputs",
                                                       "init_args": {"out": str(tmp_path / "dump")}}]},
        "model": {"init_args": {"policy": {"init_args": {
            "model": ltx2_dir, "height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "frame_rate": FRAME_RATE,
            "max_sequence_length": 16, "torch_dtype": "float32", "autocast": None, "lora": {"rank": 4, "alpha": 8}}},
            **method}},
        "data": {"prompts": ["a red cat"], "num_groups": 1, "group_size": samples_per_rollout(config, method)}}
    overlay = tmp_path / "tiny.yaml"
    overlay.write_text(yaml.safe_dump(layer))
    main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--config", str(overlay)])
    metrics = logged(tmp_path)
    assert metrics["train/check_ratio_max_dev"] < 1e-5  # the update recomputes the sampled log-probs: ratio 1
    for dimension in ("vq", "mq", "ta"):
        assert torch.isfinite(torch.tensor(metrics[f"train/reward/videoreward_{dimension}"]))
    moved = [k for k, v in torch.load(tmp_path / "dump/weights.pt").items() if "lora_B" in k and v.any()]
    assert moved and all(".attn1." in k or ".attn2." in k for k in moved)  # the video stream's LoRA trained
