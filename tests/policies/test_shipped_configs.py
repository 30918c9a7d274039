"""Every shipped GPU config (SD3.5, FLUX.1, SD1.5, Qwen-Image, Qwen-Image 2.1, FLUX.2, Z-Image, Qwen-Image-Edit, FLUX.1 Kontext) goes
through the checks a real run makes before loading (the run built, every weight load refused), and fits one batch on a tiny random-weight stand-in of its family:
the config file as shipped, with only what needs weights, GPUs or the user's prompts swapped (the model folder, reward
models, devices, the batch size, an edit's sources and their sizes) and every method option left as published."""

from pathlib import Path

import pytest
import yaml

from flowrl.cli import main
from flowrl.cli.config_checks import method_without_policy
from flowrl.rewards.base import RewardCallback
from tests.cli.no_weights import Built, stop_when_built
from tests.policies.edit_records import write_records
from tests.policies.tiny_editing import CONDITION_AREA, SOURCE_AREA

ROOT = Path(__file__).resolve().parents[2]
# the video configs (wan*, ltx2*) go through the same two checks on tiny Wan and LTX-2 pipelines in
# tests/policies/test_wan_fit.py and test_ltx2_fit.py, and on the tiny HunyuanVideo 1.5 in test_hunyuan_video15.py
GPU_CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml")
                     if not p.name.startswith(("tiny_", "quick", "wan", "ltx2", "hunyuan")))
STAND_INS = {"SD3Policy": "sd3_dir", "FluxPolicy": "flux_dir", "SD15Policy": "sd15_dir", "QwenImagePolicy": "qwen_image_dir",
             "Flux2Policy": "flux2_dir", "ZImagePolicy": "zimage_dir", "QwenImageEditPolicy": "qwen_edit_plus_dir",
             "FluxKontextPolicy": "flux_kontext_dir", "QwenImage21Policy": "qwen_image21_dir"}
PROMPTS = ["a red cat", "a blue dog"]
#: the editing families' source sizes on their tiny stand-ins (the configs' 512 x 512 would make 1024 tokens each)
TINY_SOURCES = {"source_area": SOURCE_AREA, "condition_area": CONDITION_AREA}
#: options that name files the user downloads first (like the model's weights): a stand-in starts without them
DOWNLOADS = {"generator_init": None}


def _class(path: str):
    module, _, name = path.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def family(config: str) -> str:
    policy = yaml.safe_load((ROOT / "configs" / config).read_text())["model"]["init_args"]["policy"]["class_path"]
    return policy.rpartition(".")[2]


def prompts_for(config: str, out: Path):
    """The stand-in's prompts: for an editing family prompt records with as many source images as it takes (two for
    one that takes one or more), else two prompts."""
    policy = yaml.safe_load((ROOT / "configs" / config).read_text())["model"]["init_args"]["policy"]["class_path"]
    count = _class(policy).conditioning_images
    return str(write_records(out / "records", per_record=2 if count < 0 else count)) if count else PROMPTS


def tiny_stand_in(config: str, model_dir: str, out: Path) -> Path:
    """``config`` on the CPU with a tiny model, weight-free rewards and one prompt's group per batch."""
    cfg = yaml.safe_load((ROOT / "configs" / config).read_text())
    init = cfg["model"]["init_args"]
    cfg["trainer"].update(accelerator="cpu", devices=1, num_nodes=1, strategy="auto", logger=False, enable_progress_bar=False,
                          default_root_dir=str(out), max_steps=init.get("num_inner_epochs", 1) *
                          init.get("num_minibatches", 1))
    for i, callback in enumerate(cfg["trainer"]["callbacks"]):  # reward models would download weights: weight-free
        if issubclass(_class(callback["class_path"]), RewardCallback):
            callback["class_path"] = "flowrl.rewards.JpegIncompressibility"
            callback["init_args"] = {"weight": (callback.get("init_args") or {}).get("weight", 1.0), "name": f"r{i}"}
    init.update({key: value for key, value in DOWNLOADS.items() if key in init})
    if init.get("calibration"):  # DenseGRPO's calibration is sized like the batch: shrunk with it
        init["calibration"].update(samples=2, iterations=1)
    policy = init["policy"]["init_args"]
    policy.update(model=model_dir, resolution=32, torch_dtype="float32", autocast=None, vae_chunk_size=None)
    if "max_sequence_length" in policy:
        policy["max_sequence_length"] = 8
    policy.update({key: value for key, value in TINY_SOURCES.items() if key in policy})
    method = _class(cfg["model"]["class_path"])
    options = {k: v for k, v in init.items() if "${" not in str(v)}  # interpolations: the run's parse resolves them
    leaves = method_without_policy(method, options).rollout_cost()[0]
    cfg["data"].update(prompts=prompts_for(config, out), num_groups=1,
                       group_size=max(leaves, 2 if leaves == 1 else leaves))
    path = out / config
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_a_gpu_config_passes_the_checks_before_loading_as_shipped(config, tmp_path, monkeypatch, request):
    stop_when_built(monkeypatch, {})  # the run is built, every weight load refused
    # the machine the config is for: its GPUs (the check that refuses a GPU config here has its own test)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    model_dir = request.getfixturevalue(STAND_INS[family(config)])  # the hub id would need the network
    init = yaml.safe_load((ROOT / "configs" / config).read_text())["model"]["init_args"]
    downloads = [f"--model.init_args.{key}={yaml.safe_dump(value).split()[0]}" for key, value in DOWNLOADS.items()
                 if key in init]
    with pytest.raises(Built):  # a SystemExit here is a problem the checks found: its text names it
        main(["fit", "--config", str(ROOT / "configs" / config), f"--model.init_args.policy.init_args.model={model_dir}",
              f"--data.prompts={prompts_for(config, tmp_path)}", f"--trainer.default_root_dir={tmp_path}", *downloads])


@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_a_gpu_config_fits_a_batch_on_a_tiny_stand_in(config, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    model_dir = request.getfixturevalue(STAND_INS[family(config)])
    main(["fit", "--config", str(tiny_stand_in(config, model_dir, tmp_path))])
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file() or list(tmp_path.glob("checkpoints/*.ckpt"))
