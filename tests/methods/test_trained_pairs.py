"""No run trains nothing in silence: options under which a batch trains no (sample, step) pair are rejected before
loading by one rule every method shares, naming the options that cause it; at run time a batch left with nothing to
train (every advantage NaN, every pair weighted 0) takes no optimizer step, is counted, and a few in a row stop the
run. The tree methods' option errors name the option the user set, and only the broken rule."""

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from flowrl.cli import main
from flowrl.methods import BranchGRPO, DenseGRPO, FlowGRPO, TDMR1, TempFlowGRPO, TPGRPO, TreeRPO
from tests.methods.options import option_problems
from tests.cli.test_fit import fit_args

POLICY = {"class_path": "flowrl.policies.TinyFlowPolicy"}
NOTHING = "trains no (sample, step) pair"


def problems(cls, **options) -> list[str]:
    return option_problems(cls, policy=POLICY, **options)


@pytest.mark.parametrize("cls, options, named, fix", [
    # floor(4 x 0.1) = 0 trained steps; the default fraction trains floor(4 x 0.99) = 3, the default T = 10 trains 1
    (FlowGRPO, {"num_steps": 4, "timestep_fraction": 0.1}, "model.timestep_fraction=0.1, model.num_steps=4",
     "model.timestep_fraction=0.99 (its default) would train 3"),
    # floor(10 x 0.05) = 0; DenseGRPO's default num_steps is 10, so only the fraction is named
    (DenseGRPO, {"num_steps": 10, "timestep_fraction": 0.05}, "model.timestep_fraction=0.05:",
     "model.timestep_fraction=0.99 (its default) would train 9"),
    # every one of the 4 steps pruned; without pruning all 4 (every step is an SDE step) are trained
    (BranchGRPO, {"num_steps": 4, "split_steps": [0, 2], "depth_pruning": [0, 1, 2, 3]},
     "model.depth_pruning=[0, 1, 2, 3]", "model.depth_pruning=null (its default) would train 4"),
    # TempFlow-GRPO branches on its trained steps: none at floor(4 x 0.1) = 0
    (TempFlowGRPO, {"num_steps": 4, "timestep_fraction": 0.1}, "model.timestep_fraction=0.1",
     "model.timestep_fraction=0.99 (its default) would train 3"),
    # a one-step CPS window on the last step lands on sigma 0: no log-prob (the rule, not a TP-GRPO special case)
    (TPGRPO, {"num_steps": 4, "window_start": 3, "window_size": 1}, "model.window_start=3",
     "model.window_start=0 (its default) would train 1"),
])
def test_options_that_train_no_pair_are_rejected_naming_their_cause(cls, options, named, fix):
    (problem,) = problems(cls, **options)
    assert NOTHING in problem and problem.startswith(named) and fix in problem


@pytest.mark.parametrize("cls", [FlowGRPO, DenseGRPO, BranchGRPO, TempFlowGRPO, TPGRPO, TreeRPO, TDMR1])
def test_every_method_trains_some_pair_at_its_defaults(cls):
    assert problems(cls) == []


@pytest.mark.parametrize("cls, options, expected", [
    (BranchGRPO, {"num_steps": 4, "split_steps": [0, 2], "mix_window": 0}, ["model.mix_window=0 must be >= 1"]),
    # the values the user gave are named, each with what is wrong with it (4 steps: the last is 3)
    (BranchGRPO, {"num_steps": 4, "split_steps": [0, 2], "depth_pruning": [9]},
     ["model.depth_pruning=[9]: 9 is past the last step, 3; list distinct steps in [0, 4)"]),
    (BranchGRPO, {"num_steps": 4, "split_steps": [0, 2], "depth_pruning": [-1]},
     ["model.depth_pruning=[-1]: -1 is not a step (step numbers, not Python indices: the last step is 3); list"]),
    (BranchGRPO, {"num_steps": 4, "split_steps": [0, 2], "depth_pruning": [1, 1]},
     ["model.depth_pruning=[1, 1]: 1 is listed twice; list"]),
    (BranchGRPO, {"num_steps": 4}, ["model.split_steps is unset, and its default at num_steps=4 is [0, 0, 1, 2]"]),
    (TempFlowGRPO, {"num_steps": 4, "branch_steps": [0, 0]}, ["model.branch_steps=[0, 0]: choose distinct steps"]),
    (TempFlowGRPO, {"num_steps": 4, "timestep_fraction": 1.0}, ["model.timestep_fraction=1.0 branches on the last"]),
    (TreeRPO, {"num_steps": 4, "depth_noise": -1}, ["model.depth_noise=-1 must be >= 0"]),
    (TreeRPO, {"num_steps": 4, "window_shift_every": 0}, ["model.window_shift_every=0 must be >= 1"]),
    (TDMR1, {"num_steps": 4, "trunc_steps": 10}, ["model.trunc_steps=10 exceeds the generator's num_steps=4"]),
])
def test_tree_and_few_step_option_errors_name_the_broken_rule_only(cls, options, expected):
    found = problems(cls, **options)
    assert len(found) == len(expected) and all(f.startswith(e) for f, e in zip(found, expected)), found
    assert not any("model.branch_steps=" in f for f in found if "branch_steps" not in options)  # never unset ones
    if -1 not in options.get("depth_pruning", [-1]):
        assert not any("-1" in f for f in found), found  # [9] once said "-1 is not the last step"


def test_the_rule_stops_the_cli_before_any_weight_loads():
    with pytest.raises(SystemExit) as err:  # fit_tiny.yaml: num_steps 3, floor(3 x 0.1) = 0
        main(["fit", "--config", str(Path(__file__).parents[1] / "cli" / "fit_tiny.yaml"),
              "--model.init_args.policy.init_args.model=/no/such/model", "--model.init_args.timestep_fraction=0.1"])
    assert f"model.timestep_fraction=0.1, model.num_steps=3: a FlowGRPO batch {NOTHING}" in str(err.value)


@pytest.mark.parametrize("config, options, message", [
    # each once failed late or not at all: [9] as a bare IndexError after the first validation, [-1] read as a Python
    # index, [0, 0] accepted, trunc_steps capped in silence, every rule of Dynamic-TreeRPO printed for one broken one
    ("tiny_branch_grpo", ["--model.init_args.depth_pruning=[10]"], "model.depth_pruning=[10]: 10 is past the last "
     "step, 9; list distinct steps in [0, 10)"),  # one past the config's last step, as [9] was on a shorter run
    ("tiny_branch_grpo", ["--model.init_args.depth_pruning=[-1]"], "model.depth_pruning=[-1]: -1 is not a step (step "
     "numbers, not Python indices: the last step is 9)"),
    ("tiny_branch_grpo", ["--model.init_args.mix_window=0"], "model.mix_window=0 must be >= 1"),
    ("tiny_tempflow_grpo", ["--model.init_args.branch_steps=[0,0]"], "model.branch_steps=[0, 0]: choose distinct"),
    ("tiny_tdm_r1", ["--model.init_args.trunc_steps=10"], "model.trunc_steps=10 exceeds the generator's num_steps=4"),
    ("tiny_tree_rpo", ["--model.init_args.depth_noise=-1"], "model.depth_noise=-1.0 must be >= 0"),
    ("tiny_tree_rpo", ["--model.init_args.window_shift_every=0"], "model.window_shift_every=0 must be >= 1"),
])
def test_tree_and_few_step_options_fail_in_the_cli_before_loading(config, options, message):
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / f"{config}.yaml"), *options,
              "--model.init_args.policy.init_args.model=/no/such/model"])  # never opened: checked before
    problems = [p for p in str(err.value).splitlines()[1:] if "/no/such/model" not in p]
    assert len(problems) == 1 and message in problems[0], str(err.value)  # the broken rule only


class NaNAdvantages(FlowGRPO):
    """Flow-GRPO whose advantages are all NaN (an estimator gone wrong)."""

    def advantages(self, batch):
        return torch.full_like(batch.step_rewards, float("nan"))


class ZeroWeights(FlowGRPO):
    """Flow-GRPO whose loss weights are all 0 (a hook that prunes everything)."""

    def loss_weights(self, batch):
        return torch.zeros_like(batch.log_probs)


class Weights(Callback):
    """The LoRA weights after every batch."""

    seen: list = []

    def on_train_batch_end(self, trainer, pl_module, *args):
        Weights.seen.append({n: p.detach().clone() for n, p in pl_module.named_parameters() if "lora_B" in n})


@pytest.mark.parametrize("method, why", [("NaNAdvantages", "every advantage of a trained pair is NaN or inf"),
                                         ("ZeroWeights", "every trained pair has loss weight 0")])
def test_batches_that_train_nothing_take_no_step_are_counted_and_stop_the_run(tiny_model_dir, tmp_path, method, why):
    Weights.seen = []
    args = fit_args(tiny_model_dir, tmp_path, f"--model.class_path=tests.methods.test_trained_pairs.{method}",
                    "--model.init_args.max_untrained_batches=2", "--trainer.max_steps=4",
                    "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
                    "--trainer.callbacks+=tests.methods.test_trained_pairs.Weights")
    with pytest.raises(RuntimeError, match=rf"2 batches in a row trained no \(sample, step\) pair .*{why}"):
        main(args)
    assert len(Weights.seen) == 1  # the first batch ended (no step taken); the second raised
    assert all(not w.any() for w in Weights.seen[0].values())  # LoRA B starts at 0 and stayed there
    (metrics,) = tmp_path.glob("**/metrics.csv")
    logged = [float(r["train/untrained_batches"]) for r in csv.DictReader(metrics.open())
              if r.get("train/untrained_batches")]
    assert logged == [1.0]
