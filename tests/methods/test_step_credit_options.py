"""MixGRPO's window and Flash-GRPO's one step per group as Flow-GRPO options: the checks before loading name each
broken rule, and a real fit trains exactly the steps the pure schedules choose (sampling/windows.py, flash.py)."""

import pytest
import torch

from flowrl.cli import main
from flowrl.methods import FlowGRPO
from tests.methods.options import option_problems
from flowrl.sampling.flash import group_steps
from flowrl.sampling.windows import window_mask
from tests.cli.test_fit import fit_args, load_steps

POLICY = {"class_path": "flowrl.policies.TinyFlowPolicy"}


@pytest.mark.parametrize("options, message", [
    ({"sde_window": 0}, "model.sde_window=0"),
    ({"sde_window": 2, "window_strategy": "decay"}, "model.window_strategy='decay'"),
    ({"sde_window": 2, "window_range": [5, 3]}, "model.window_range=[5, 3)"),
    ({"ode_solver_after_window": "dpmsolver++"}, "set model.sde_window"),
    ({"sde_window": 2, "ode_solver_after_window": "unipc"}, "model.ode_solver_after_window='unipc'"),
    ({"flash_pool": [0], "flash_noise": True, "step_kind": "cps"}, "sets the flow_grpo step's std, not the cps"),
    ({"flash_pool": [0, 12]}, "model.flash_pool=[0, 12]"),
    ({"flash_pool": [0], "sde_window": 2}, "both choose the stochastic steps"),
    ({"rectify": "batch"}, "model.rectify='batch'"),
    ({"flash_pool": [0], "rectify": "micro"}, "model.rectify='micro'"),
    ({"train_chunks": 0.5}, "set model.loss=chunk_gspo@gcpo"),
    ({"train_chunks": 0.2, "loss": "chunk_gspo", "loss_options": {"chunks": [4, 5]}}, "trains int(2 x 0.2) = 0"),
    ({"chunk_weighting": "normalized"}, "needs model.train_chunks"),
    ({"train_chunks": 0.5, "loss": "chunk_gspo", "loss_options": {"chunks": [4, 5]}, "chunk_weighting": "max"},
     "model.chunk_weighting='max'"),
])
def test_bad_step_credit_options_are_named(options, message):
    problems = option_problems(FlowGRPO, policy=POLICY, num_steps=10, **options)
    assert any(message in p for p in problems), problems


def test_published_settings_pass_the_checks():
    assert option_problems(FlowGRPO, policy=POLICY, num_steps=25, sde_window=4) == []  # MixGRPO
    assert option_problems(FlowGRPO, policy=POLICY, num_steps=25, sde_window=4,
                           ode_solver_after_window="dpmsolver++") == []  # MixGRPO-Flash
    assert option_problems(FlowGRPO, policy=POLICY, num_steps=20, flash_pool=list(range(10)), flash_noise=True,
                           rectify="batch", noise_level=1.0) == []  # Flash-GRPO
    assert option_problems(FlowGRPO, policy=POLICY, num_steps=17, loss="chunk_gspo@gcpo", clip_range=5e-5,
                           train_chunks=0.5, timestep_fraction=1.0) == []  # GCPO


def trained_columns(step):
    """The steps each row trains: its non-zero advantages (advantages are 0 off the train mask)."""
    return [set(row.nonzero().flatten().tolist()) for row in step["advantages"]]


@pytest.mark.parametrize("solver", [None, "dpmsolver++"])
def test_mixgrpo_window_slides_over_batches(tiny_model_dir, tmp_path, solver):
    # T = 3, window 1 in [0, 2): batch 0 trains step 0, batch 1 step 1, batch 2 step 0 again; MixGRPO-Flash's solver
    # after the window changes the images, not which steps train
    extra = [] if solver is None else [f"--model.init_args.ode_solver_after_window={solver}"]
    main(fit_args(tiny_model_dir, tmp_path, "--model.init_args.sde_window=1", "--model.init_args.window_shift_every=1",
                  "--model.init_args.window_range=[0, 2]", "--trainer.max_steps=3", *extra))
    steps = load_steps(tmp_path)
    for b in range(3):
        window = set(window_mask(b, num_steps=3, size=1, every=1, low=0, high=2).nonzero().flatten().tolist())
        assert window == {b % 2}
        columns = trained_columns(steps[f"step{b}_rank0"])
        assert all(c <= window for c in columns) and any(c == window for c in columns)


def test_flash_trains_one_step_per_group_with_rectified_weights(tiny_model_dir, tmp_path):
    main(fit_args(tiny_model_dir, tmp_path, "--model.init_args.flash_pool=[0, 1]", "--model.init_args.flash_noise=true",
                  "--model.init_args.rectify=batch", "--trainer.max_steps=2"))
    for b, step in enumerate(load_steps(tmp_path).values()):
        drawn = group_steps(step["group_ids"], [0, 1], seed=3, iteration=b)  # fit_tiny.yaml: seed 3
        columns = trained_columns(step)
        assert all(c <= {int(d)} for c, d in zip(columns, drawn)) and sum(map(len, columns)) > len(columns) // 2


@pytest.mark.parametrize("weighting", [None, "normalized"])
def test_gcpo_trains_whole_drawn_chunks(tiny_model_dir, tmp_path, weighting):
    # T = 3, chunks [1, 2], half of them: each row trains step 0 alone or steps 1-2 together
    extra = [] if weighting is None else [f"--model.init_args.chunk_weighting={weighting}"]
    main(fit_args(tiny_model_dir, tmp_path, "--model.init_args.loss=chunk_gspo", "--model.init_args.train_chunks=0.5",
                  "--model.init_args.loss_options={chunks: [1, 2]}", "--model.init_args.timestep_fraction=1.0",
                  *extra))
    seen = set()
    for step in load_steps(tmp_path).values():
        columns = trained_columns(step)
        assert all(c <= {0} or c <= {1, 2} for c in columns)
        seen |= {frozenset(c) for c in columns}
    assert {frozenset({0}), frozenset({1, 2})} <= seen  # both chunks drawn over the run


def test_sde_mask_of_the_options_is_the_schedule():
    from flowrl.policies import TinyFlowPolicy
    method = FlowGRPO(TinyFlowPolicy(), num_steps=10, sde_window=2, window_strategy="random", window_range=[0, 5],
                      seed=7)
    for b in range(5):
        expected = window_mask(b, num_steps=10, size=2, strategy="random", low=0, high=5, seed=7)
        assert torch.equal(method.sde_mask(b), expected)
    flash = FlowGRPO(TinyFlowPolicy(), num_steps=10, flash_pool=[1, 3])
    assert flash.sde_mask().nonzero().flatten().tolist() == [1, 3]  # what the check before loading sees


def test_rectified_loss_weights_follow_each_rows_step():
    from types import SimpleNamespace

    from flowrl.sampling.flash import rectification
    sigmas = torch.tensor([1.0, 0.8, 0.5, 0.2, 0.0])
    method = SimpleNamespace(rectify="batch", num_steps=4, flash_pool=[0, 1],
                             policy=SimpleNamespace(sigmas=lambda n: sigmas))
    train = torch.tensor([[True, False, False, False], [False, True, False, False], [False, True, False, False]])
    batch = SimpleNamespace(log_probs=torch.zeros(3, 4), train_mask=train, valid=torch.tensor([True, True, False]))
    weights = FlowGRPO.loss_weights(method, batch)
    coe = rectification(sigmas)
    mean = (coe[0] + coe[1]) / 2  # over the valid rows only; the third row has no valid reward
    torch.testing.assert_close(weights[:, 0], torch.stack([coe[0] / mean, coe[1] / mean, torch.tensor(0.0)]))
