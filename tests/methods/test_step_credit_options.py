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
    ({"sde_window": 2, "tail_compress": 0.0}, "model.tail_compress=0.0 must be in (0, 1]"),
    ({"sde_window": 2, "tail_compress": 1.5}, "model.tail_compress=1.5 must be in (0, 1]"),
    ({"tail_compress": 0.4}, "model.tail_compress=0.4 compresses the ODE steps after MixGRPO's window: set "
                             "model.sde_window, or model.tail_compress=1"),
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
                           ode_solver_after_window="dpmsolver++", tail_compress=0.4) == []  # MixGRPO-Flash
    assert option_problems(FlowGRPO, policy=POLICY, num_steps=20, flash_pool=list(range(10)), flash_noise=True,
                           rectify="batch", noise_level=1.0) == []  # Flash-GRPO
    assert option_problems(FlowGRPO, policy=POLICY, num_steps=17, loss="chunk_gspo@gcpo", clip_range=5e-5,
                           train_chunks=0.5, timestep_fraction=1.0) == []  # GCPO


def trained_columns(step):
    """The steps each row trains: its non-zero advantages (advantages are 0 off the train mask)."""
    return [set(row.nonzero().flatten().tolist()) for row in step["advantages"]]


@pytest.mark.parametrize("solver, compress", [(None, None), ("dpmsolver++", None), ("dpmsolver++", 0.4)])
def test_mixgrpo_window_slides_over_batches(tiny_model_dir, tmp_path, solver, compress):
    # T = 3, window 1 in [0, 2): batch 0 trains step 0, batch 1 step 1, batch 2 step 0 again; MixGRPO-Flash's solver
    # after the window, and its compressed tail, change the images, not which steps train
    extra = [] if solver is None else [f"--model.init_args.ode_solver_after_window={solver}"]
    extra += [] if compress is None else [f"--model.init_args.tail_compress={compress}"]
    main(fit_args(tiny_model_dir, tmp_path, "--model.init_args.sde_window=1", "--model.init_args.window_shift_every=1",
                  "--model.init_args.window_range=[0, 2]", "--trainer.max_steps=3", *extra))
    steps = load_steps(tmp_path)
    for b in range(3):
        window = set(window_mask(b, num_steps=3, size=1, every=1, low=0, high=2).nonzero().flatten().tolist())
        assert window == {b % 2}
        columns = trained_columns(steps[f"step{b}_rank0"])
        assert all(c <= window for c in columns) and any(c == window for c in columns)
        # 8 rows of 3 model calls; compressed after a window at step 0: int((3 - 0) x 0.4) = 1 -> 2 points, 1 step
        # instead of 2 (after step 1 nothing is left to compress)
        calls = 2 if compress is not None and b % 2 == 0 else 3
        assert float(steps[f"step{b}_rank0"]["evaluations"]) == 8 * calls


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


@pytest.mark.parametrize("compress", [1.0, 0.6])
def test_a_compressed_tail_samples_the_window_as_the_full_grid_and_counts_its_calls(tiny_model_dir, compress):
    from flowrl.policies import LoraOptions, TinyFlowPolicy
    from tests.methods.counting import counted_rollout

    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    options = dict(num_steps=6, sde_window=2, window_range=[0, 2], guidance_scale=2.0, seed=3)
    batch = {"prompts": ["red 1 and blue 2", "green 3 and red 4"], "group_ids": torch.tensor([0, 1]),
             "seeds": torch.tensor([7, 8])}
    plain, plain_calls = counted_rollout(FlowGRPO(policy, **options), batch)  # no option
    method = FlowGRPO(policy, tail_compress=compress, **options)
    rollout, calls = counted_rollout(method, batch)
    if compress == 1.0:  # the grid's own steps: the rollout as without the option, bit for bit
        assert torch.equal(rollout.latents, plain.latents) and calls == plain_calls == 6
        assert method.rollout_cost() == (1, 6)
        return
    # window [0, 2), L = 1: int(5 x 0.6) = 3 points [2, 4, 6] after it, so the model at steps 0, 1, 2, 4
    assert calls == 4 and rollout.nfe.tolist() == [4, 4] and method.rollout_cost() == (1, 4)
    assert torch.equal(rollout.latents[:, :3], plain.latents[:, :3])  # the noise and the window's 2 SDE steps
    assert torch.equal(rollout.log_probs, plain.log_probs) and torch.equal(rollout.train_mask, plain.train_mask)
    assert rollout.latents.shape == plain.latents.shape and rollout.log_probs[:, :2].ne(0).all()
    sigmas, rows = rollout.sigmas[0], torch.arange(2)
    velocity = method.generation.velocity_fn(method.policy.encode(batch["prompts"]), rows)
    with torch.no_grad():  # Euler on the sub-grid [2, 4, 6], the skipped states on its path
        z2 = rollout.latents[:, 2]
        z4 = z2 + (sigmas[4] - sigmas[2]) * velocity(z2, sigmas[2].expand(2), rows)
        z6 = z4 + (sigmas[6] - sigmas[4]) * velocity(z4, sigmas[4].expand(2), rows)
    torch.testing.assert_close(rollout.latents[:, 4], z4, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rollout.latents[:, 6], z6, rtol=1e-5, atol=1e-6)
    weight = (sigmas[3] - sigmas[2]) / (sigmas[4] - sigmas[2])
    torch.testing.assert_close(rollout.latents[:, 3], z2 + weight * (z4 - z2), rtol=1e-5, atol=1e-6)


def test_a_compressed_tail_is_refused_where_completions_start_at_every_state():
    from flowrl.methods import DenseGRPO
    problems = option_problems(DenseGRPO, policy=POLICY, num_steps=10, sde_window=2, tail_compress=0.4)
    assert any("model.tail_compress=0.4 skips states whose completions DenseGRPO scores" in p for p in problems)
