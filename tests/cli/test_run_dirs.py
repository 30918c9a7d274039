"""Each run writes into a folder of its own (``<default_root_dir>/<name>/version_N``: TensorBoard events,
metrics.csv, config, samples, checkpoints), never deletes another run's metrics, resumes into a new version that the
plotting script joins to the one it resumed from, and shows a progress bar in optimizer steps."""

import csv
import importlib.util
import re
import threading
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.cli.log_versions import reserve_version

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("plot_rewards", ROOT / "scripts" / "plot_rewards.py")
plot_rewards = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_rewards)


def shipped(out: Path, tiny_model_dir: str, *extra: str) -> list[str]:
    """configs/tiny_flow_grpo.yaml with its loggers, on the random-weight tiny model, shrunk to seconds."""
    return ["fit", "--config", str(ROOT / "configs/tiny_flow_grpo.yaml"), f"--trainer.default_root_dir={out}",
            f"--model.init_args.policy.init_args.model={tiny_model_dir}", "--model.init_args.num_steps=2",
            f"--data.prompts={ROOT}/configs/prompts/digits_train.txt", "--data.val_prompts=null",
            "--data.num_groups=2", "--data.group_size=2", "--trainer.enable_progress_bar=false", *extra]


def rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_runs_get_their_own_versions_and_keep_each_others_metrics(tiny_model_dir, tmp_path, capsys):
    main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=2"))
    first = tmp_path / "tiny_flow_grpo" / "version_0"
    before = (first / "metrics.csv").read_text()
    assert list(first.glob("events.out.tfevents.*")) and (first / "config.yaml").is_file()
    assert f"logs:        {first} (TensorBoard, metrics.csv)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="lr=-0.001 must be > 0"):  # fails at once, before any folder is made
        main(shipped(tmp_path, tiny_model_dir, "--model.init_args.optimizer.init_args.lr=-1e-3"))
    main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=4"))
    second = tmp_path / "tiny_flow_grpo" / "version_1"
    assert (first / "metrics.csv").read_text() == before  # the later run deleted nothing
    assert list(second.glob("events.out.tfevents.*")) and (second / "metrics.csv").is_file()
    assert len([r for r in rows(second / "metrics.csv") if r["train/reward/total"]]) == 4
    assert sorted(p.name for p in (tmp_path / "tiny_flow_grpo").iterdir()) == ["latest", "version_0", "version_1"]


@pytest.mark.parametrize("extra", [[], ["--data.group_size=4", "--model.init_args.downsample_to=2"]],
                         ids=["every_row", "pods"])  # PODS: the rows trained are chosen again alike after the resume
def test_a_resumed_run_gets_a_new_version_that_plot_rewards_joins(extra, tiny_model_dir, tmp_path):
    run = lambda *args: shipped(*args, *extra)  # noqa: E731
    main(run(tmp_path, tiny_model_dir, "--trainer.max_steps=4"))
    straight = plot_rewards.read_metrics(tmp_path / "tiny_flow_grpo" / "version_0" / "metrics.csv")
    ckpt = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps=2", "--trainer.callbacks.save_top_k=-1"]
    main(run(tmp_path, tiny_model_dir, "--trainer.max_steps=2", *ckpt))
    first = tmp_path / "tiny_flow_grpo" / "version_1"
    kept = (first / "metrics.csv").read_text()
    (saved,) = first.glob("checkpoints/epoch=0-step=2.ckpt")
    main(run(tmp_path, tiny_model_dir, "--trainer.max_steps=4", f"--ckpt_path={saved}"))
    resumed = tmp_path / "tiny_flow_grpo" / "version_2"
    assert (first / "metrics.csv").read_text() == kept  # the history before the resume is still there
    assert [int(float(r["step"])) for r in rows(resumed / "metrics.csv") if r["train/reward/total"]] == [2, 3]
    joined = plot_rewards.read_metrics(resumed / "metrics.csv")
    trained = lambda rs: [(r["step"], r["train/reward/total"]) for r in rs if "train/reward/total" in r]  # noqa
    assert trained(joined) == trained(straight)  # the joined history is the uninterrupted run's, step for step


def test_default_root_dir_moves_every_output(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the configs' default, runs/, would land here
    main(shipped(tmp_path / "elsewhere", tiny_model_dir, "--trainer.max_steps=2"))  # its ModelCheckpoint saves last
    assert not (tmp_path / "runs").exists()
    folder = tmp_path / "elsewhere" / "tiny_flow_grpo" / "version_0"
    assert (folder / "metrics.csv").is_file() and (folder / "checkpoints" / "last.ckpt").is_file()
    assert list((folder / "samples").glob("step_*.png"))


def test_runs_started_together_reserve_different_versions(tmp_path):
    got, start = [], threading.Barrier(8)

    def reserve():
        start.wait()
        got.append(reserve_version(tmp_path / "name"))

    threads = [threading.Thread(target=reserve) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(got) == list(range(8))


def test_progress_bar_counts_optimizer_steps_of_the_run(tiny_model_dir, tmp_path, capsys):
    main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=4", "--model.init_args.num_minibatches=2",
                 "--trainer.enable_progress_bar=true", "--trainer.logger=false"))
    out = capsys.readouterr()
    bar = out.out + out.err
    assert "steps: 100%" in bar and "4/4" in bar and "reward/total=" in bar
    assert "Epoch" not in bar and "v_num" not in bar and "/-2" not in bar


def test_latest_names_the_newest_run_and_predict_reads_through_it(tiny_model_dir, tmp_path, recwarn):
    main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=2"))
    main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=2"))
    latest = tmp_path / "tiny_flow_grpo" / "latest"
    assert latest.is_symlink() and latest.resolve() == (tmp_path / "tiny_flow_grpo" / "version_1").resolve()
    out = tmp_path / "predicted"
    main(["predict", "--ckpt_path", str(latest / "checkpoints" / "last.ckpt"), "--prompts", "red 3 and blue 7",
          "--seeds", "0", "--num_steps", "2", "--out", str(out), "--trainer.enable_progress_bar=false"])
    assert (out / "grid.png").is_file()
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]  # nothing the user can act on


def test_a_run_that_fails_after_reserving_its_version_gives_it_back(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="val_limit=0"):  # raised by the data module, after the version is reserved
        main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=2", "--data.val_limit=0"))
    assert not (tmp_path / "tiny_flow_grpo").exists() or not list((tmp_path / "tiny_flow_grpo").iterdir())
    main(shipped(tmp_path, tiny_model_dir, "--trainer.max_steps=2"))
    assert (tmp_path / "tiny_flow_grpo" / "version_0" / "metrics.csv").is_file()


def test_help_names_the_command_a_user_types(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m flowrl [options] fit")


def test_top_level_help_lists_every_subcommand_and_each_one_runs(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    listed = re.search(r"\{([a-z,]+)\}", usage).group(1).split(",")
    # evaluate and export were once left out
    assert listed == ["fit", "validate", "test", "predict", "evaluate", "export"], usage
    for name in listed:  # each one listed is one a user can run: its own --help names it
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code in (0, None) and re.match(rf"usage: python -m flowrl (\[options\] )?{name} ",
                                                         capsys.readouterr().out), name


def test_a_command_builds_the_parser_of_its_own_subcommand_only(monkeypatch, capsys):
    # each of LightningCLI's subcommand parsers reads the Trainer's, the method's and the data's signatures: a sixth
    # of a tiny fit's CPU time per parser; the top-level help alone needs every one (the test above: each is listed)
    from lightning.pytorch.cli import LightningCLI

    built, prepare = [], LightningCLI._prepare_subcommand_parser
    monkeypatch.setattr(LightningCLI, "_prepare_subcommand_parser",
                        lambda self, klass, name, **kw: built.append(name) or prepare(self, klass, name, **kw))
    for command, expected in ((["validate", "--help"], ["validate"]), (["--help"], ["fit", "validate", "test",
                                                                                     "predict"])):
        built.clear()
        with pytest.raises(SystemExit):
            main(command)
        assert built == expected, command
    capsys.readouterr()
