"""Docs are executed: every YAML in configs/ parses (a class it names that does not exist fails), and the quickstart
runs (one step) on the embedded model. The GPU configs also pass the checks before loading and fit a batch on tiny
stand-ins of their families: tests/policies/test_shipped_configs.py."""

from pathlib import Path

import pytest

from flowrl.cli import main

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_config_parses(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "class_path: flowrl.methods." in capsys.readouterr().out


def test_quickstart_runs_one_step_and_prints_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    main(["fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps=2", "--trainer.logger=false",
          f"--trainer.default_root_dir={tmp_path}", "--data.num_groups=2", "--data.group_size=2",
          "--data.val_prompts=[red 3 and blue 7]", "--trainer.enable_progress_bar=false"])
    out = capsys.readouterr()
    assert "flowrl run summary" in out.out + out.err
    assert "val digit_alignment:" in out.out + out.err
