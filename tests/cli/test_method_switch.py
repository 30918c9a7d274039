"""The one-line method switch from the quickstart (``--model.class_path=flowrl.methods.<M>``): the config's options
the new method lacks are left out with one notice, every remaining problem is named in one round with the value that
fits, and every option of the command line holds whatever its place. Each run stops where training would start, with
every weight load refused, after every check that runs before a weight loads."""

from pathlib import Path

import pytest

import flowrl.cli
from flowrl.cli import FlowRLCLI, main
from tests.cli.no_weights import Built, stop_when_built

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs/quickstart.yaml")


@pytest.fixture
def checked(monkeypatch):
    """Runs ``fit`` up to where training would start, weights refused; returns the parsed config, or the error's
    text."""
    def fit(*args: str):
        seen = {}
        stop_when_built(monkeypatch, seen)
        try:
            main(["fit", "--config", QUICKSTART, *args])
        except Built:
            return seen["cli"].config.fit
        except SystemExit as err:
            return str(err)
        raise AssertionError("fit went past the checks")
    return fit


# (method, the one option the first round's error names, as it names it (None: the switch runs as it is), whether
# the quickstart sets options the method lacks)
SWITCHES = [
    ("DenseGRPO", None, None, True),  # it refuses tail_compress (its completions start at every state)
    ("FlowGRPO", None, None, False),  # the config's own class
    ("DiffusionNFT", None, None, True),
    ("TPGRPO", "--model.init_args.window_size=6", "--model.init_args.window_size=6", True),
    ("TempFlowGRPO", "--data.group_size=18", "use 18, 36", True),
    ("G2RPO", "--data.group_size=72", "use 72, 144", True),  # 12 members x 3 of 6 steps x 2 granularities
    ("TreeRPO", "--data.group_size=16", "use 16, 32", True),
    ("BranchGRPO", "--data.group_size=16", "use 16, 32", True),
    ("TDMR1", None, None, True),  # the quickstart samples without CFG, as a TDM-R1 generator does
]


@pytest.mark.parametrize("method, fix, named, drops", SWITCHES)
def test_the_quickstart_switches_to_every_method_in_one_round(checked, capsys, method, fix, named, drops):
    switch = f"--model.class_path=flowrl.methods.{method}"
    first = checked(switch)
    if fix is None:
        assert not isinstance(first, str), first
    else:  # one problem, with the value that fits, and nothing about the options the config sets for Flow-GRPO
        assert isinstance(first, str) and first.count("\n  ") == 1 and named in first, first
        assert "has no option" not in first
        second = checked(switch, fix)
        assert not isinstance(second, str), second
    assert second_class(first if fix is None else second) == f"flowrl.methods.{method}"
    notices = [line for line in capsys.readouterr().out.splitlines() if "which the config sets: left out" in line]
    assert len(notices) == drops * (2 if fix else 1)  # one line a run


def second_class(config) -> str:
    return config.model.class_path


def test_the_dropped_options_are_named_in_one_line_and_fail_when_typed(checked, capsys):
    config = checked("--model.class_path=flowrl.methods.TDMR1", "--model.init_args.guidance_scale=1.0")
    notice, = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert notice.startswith("flowrl: --model.class_path=flowrl.methods.TDMR1 has no option loss, loss_options, "
                             "noise_level, num_inner_epochs, num_minibatches, sde_window, step_kind, "
                             "tail_compress, timestep_fraction, window_range, which the config sets")
    assert "timestep_fraction" not in config.model.init_args
    # typed by the user, the same option is an error, named with every other problem of the command at once
    out = checked("--model.class_path=flowrl.methods.TreeRPO", "--model.init_args.timestep_fraction=0.5",
                  "--model.init_args.num_stepz=3")
    problems = out.splitlines()[1:]
    assert problems[0].startswith("  --model.init_args.timestep_fraction=0.5: flowrl.methods.TreeRPO has no option "
                                  "timestep_fraction")
    assert problems[1] == ("  --model.init_args.num_stepz=3: flowrl.methods.TreeRPO has no option num_stepz; did you "
                           "mean --model.init_args.num_steps?")
    assert "data.group_size=8 is not a multiple of the 16 samples" in problems[2] and len(problems) == 3


@pytest.mark.parametrize("switch", ["flowrl.methods.DenseGRPO", "flowrl.methods.FlowGRPO"])
def test_options_before_the_switch_carry_over(checked, monkeypatch, switch):
    config = checked("--model.init_args.num_steps=4", "--data.group_size=4", f"--model.class_path={switch}",
                     "--model.init_args.beta=0.01")
    assert (config.model.init_args.num_steps, config.model.init_args.beta, config.data.group_size) == (4, 0.01, 4)
    assert config.model.init_args.eval_num_steps == 10  # the config's, kept
    # a resume with a switch: the same command line with the checkpoint (its reading is not what is tested here)
    monkeypatch.setattr(FlowRLCLI, "_parse_ckpt_path", lambda self: None)
    monkeypatch.setattr(flowrl.cli, "config_problems", lambda config: [])
    config = checked("--model.init_args.num_steps=4", f"--model.class_path={switch}", "--ckpt_path=last.ckpt")
    assert config.model.init_args.num_steps == 4 and config.ckpt_path == "last.ckpt"


def test_a_switched_tiny_fit_runs_with_the_option_given_before_the_switch(tiny_model_dir, tmp_path, capsys):
    # the one fit of this file: fit_tiny.yaml (Flow-GRPO, PPO's clip_range) switched to DiffusionNFT, which lacks it
    main(["fit", "--config", str(ROOT / "tests/cli/fit_tiny.yaml"), "--model.init_args.num_steps=2",
          f"--model.init_args.policy.init_args.model={tiny_model_dir}", "--model.class_path=flowrl.methods.DiffusionNFT",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1"])
    out = capsys.readouterr().out
    assert "flowrl: --model.class_path=flowrl.methods.DiffusionNFT has no option clip_range, which the config sets" in out
    assert "flowrl fit: DiffusionNFT on TinyFlowPolicy" in out and "; 2 sampling steps," in out  # not the config's 3


@pytest.mark.parametrize("switch, kept", [("DenseGRPO", False), ("TPGRPO", False), ("FlowGRPO", True)])
def test_pods_set_by_the_config_is_left_out_where_the_method_credits_steps(checked, capsys, tmp_path, switch, kept):
    # a quickstart that trains 4 of each group's 8 rows: DenseGRPO and TP-GRPO inherit the option but refuse it
    (tmp_path / "pods.yaml").write_text("model: {init_args: {downsample_to: 4}}")
    fix = ["--model.init_args.window_size=6"] if switch == "TPGRPO" else []
    config = checked("--config", str(tmp_path / "pods.yaml"), f"--model.class_path=flowrl.methods.{switch}", *fix)
    assert not isinstance(config, str), config
    assert (config.model.init_args.get("downsample_to") == 4) == kept
    notices = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert kept or any("downsample_to" in line for line in notices), notices
