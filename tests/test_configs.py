"""Docs are executed: every YAML in configs/ parses (a class it names that does not exist fails), and the quickstart
runs (one step) on the embedded model. The GPU configs also pass the checks before loading and fit a batch on tiny
stand-ins of their families: tests/policies/test_shipped_configs.py."""

import importlib
from pathlib import Path

import pytest
import yaml

from flowrl.cli import main
from flowrl.methods.policy_gradient import PolicyGradient

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_config_parses(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "class_path: flowrl.methods." in capsys.readouterr().out


def test_every_published_beta_states_its_kl_convention():
    """A policy-gradient config with a KL term states the units of its beta (``kl_convention``): a published beta
    means what it meant only under its authors' convention, and the method's default is no source."""
    with_kl = {}
    for config in CONFIGS:
        model = yaml.safe_load(config.read_text())["model"]
        module, name = model["class_path"].rsplit(".", 1)
        args = model.get("init_args", {})
        if issubclass(getattr(importlib.import_module(module), name), PolicyGradient) and args.get("beta", 0) > 0:
            with_kl[config.name] = args.get("kl_convention")
    assert {"sd35_flow_grpo.yaml", "wan21_flow_grpo.yaml", "wan21_tempflow_grpo.yaml"} <= with_kl.keys()
    assert [name for name, convention in with_kl.items() if convention is None] == []


def test_quickstart_runs_one_step_and_prints_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    main(["fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps=2", "--trainer.logger=false",
          f"--trainer.default_root_dir={tmp_path}", "--data.num_groups=2", "--data.group_size=2",
          "--data.val_prompts=[red 3 and blue 7]", "--trainer.enable_progress_bar=false"])
    out = capsys.readouterr()
    assert "flowrl run summary" in out.out + out.err
    assert "val digit_alignment:" in out.out + out.err
