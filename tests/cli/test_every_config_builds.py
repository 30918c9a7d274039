"""Every shipped config (``configs/*.yaml``) goes through the CLI as a user runs it, with every weight load refused
(diffusers' and transformers' ``from_pretrained``, ``FlowPolicy.load``), and gets its whole list of problems before
any weight loads: none for a config whose model is here (the tiny ones, the quickstart: the run is built and stops
where training would start); for a config of a hub model, with an empty offline cache, the one problem of its model
not being here (the policy cannot be built without its configs, so the method is checked without it). A bad policy
option of each family, with the method's and the data's: ``tests/policies/test_build_light.py``."""

from pathlib import Path

import pytest

from flowrl.cli import main
from tests.cli.no_weights import Built, stop_when_built

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
HERE = [c for c in CONFIGS if c.startswith(("tiny_", "quickstart"))]  # flowrl/tiny-digits ships with the package
HUB = [c for c in CONFIGS if c not in HERE]


def problems_of(*args: str) -> list[str]:
    """The problems ``fit`` reports (``[]``: the run was built and stopped where training would start)."""
    try:
        main(["fit", *args])
    except Built:
        return []
    except SystemExit as err:
        text = str(err)
        assert text.startswith("flowrl: invalid configuration:"), text
        return text.split("\n  ")[1:]
    raise AssertionError("fit went past the point where training would start")


@pytest.fixture
def gpu_machine(monkeypatch, tmp_path):
    """The machine a shipped config is for (8 GPUs; the check that refuses a GPU config here has its own test),
    offline with an empty hub cache, weights refused, stopping where training would start."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HOME", str(tmp_path))
    stop_when_built(monkeypatch, {})


@pytest.mark.parametrize("config", HERE)
def test_a_config_whose_model_is_here_builds_with_no_problem_and_no_weight(config, gpu_machine, tmp_path):
    assert problems_of("--config", str(ROOT / "configs" / config), f"--trainer.default_root_dir={tmp_path}") == []


@pytest.mark.parametrize("config", HUB)
def test_a_hub_config_has_one_problem_its_model_not_being_here(config, gpu_machine, tmp_path):
    prompts = tmp_path / "prompts.txt"  # the user's prompt file (the configs name one they download)
    prompts.write_text("a red cat\na blue dog\n")
    image_records = "i2v" in config or "edit" in config or "kontext" in config
    args = [] if image_records else [f"--data.prompts={prompts}"]
    if "generator_init" in (ROOT / "configs" / config).read_text():  # a LoRA file the user downloads too
        args.append("--model.init_args.generator_init=null")
    found = problems_of("--config", str(ROOT / "configs" / config), f"--trainer.default_root_dir={tmp_path}", *args)
    model = [p for p in found if p.startswith("model.init_args.policy.init_args.model=")]
    assert len(model) == 1 and "is not in the local hub cache and HF_HUB_OFFLINE is set" in model[0], found
    others = [p for p in found if p not in model and not p.startswith("data.prompts=")]
    assert others == [], others  # an image-records config's prompt file is the user's: named, and nothing else
