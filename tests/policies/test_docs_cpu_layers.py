"""The docs' offline worked examples for Qwen-Image (docs/models.md) and Qwen-Image-Edit (docs/editing.md): the shipped
config with its CPU layer under ``docs/data/`` on the tests' tiny random-weight pipeline builds, every check before
loading passes, and no weight loads (the pages' commands, stopped where training would start; the Kontext and Wan
examples run whole in ``test_edit_fits.py`` and ``test_wan_fit.py``)."""

from pathlib import Path

import pytest

from tests.cli.test_every_config_builds import problems_of
from tests.cli.no_weights import stop_when_built

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config, layer, model_dir", [
    ("qwen_image_flow_grpo.yaml", "qwen_image/tiny_cpu.yaml", "qwen_image_dir"),
    ("qwen_image_edit_flow_grpo.yaml", "editing/tiny_qwen_edit_cpu.yaml", "qwen_edit_plus_dir"),
])
def test_the_pages_tiny_example_builds_from_the_shipped_config_and_its_cpu_layer(config, layer, model_dir, request,
                                                                                 monkeypatch, tmp_path):
    model = request.getfixturevalue(model_dir)
    monkeypatch.chdir(ROOT)  # the pages' commands run from the repository (the layer's records file is relative)
    monkeypatch.syspath_prepend(str(ROOT / "docs/data/editing"))  # the page's PYTHONPATH: its edit_rewards.py
    seen: dict = {}
    stop_when_built(monkeypatch, seen)
    assert problems_of("--config", str(ROOT / "configs" / config), "--config", str(ROOT / "docs/data" / layer),
                       f"--model.init_args.policy.init_args.model={model}",
                       f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}") == []
    cli = seen["cli"]
    assert cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator" and cli.trainer.max_steps == 2
    assert cli.model.policy.resolution == 32 and cli.model.policy.lora.rank == 4
