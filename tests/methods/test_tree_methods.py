"""TempFlow-GRPO, Dynamic-TreeRPO and BranchGRPO on a random-weight tiny model: NFE counted through the model, the
papers' worked numbers, edges trained once, their options refused before any weight loads (2 processes against
1: tests/methods/test_two_ranks_equal_one.py)."""

from pathlib import Path

import pytest
import torch
import yaml
from diffusers import FlowMatchEulerDiscreteScheduler

from flowrl import advantages as adv_lib
from flowrl.cli import main
from flowrl.methods import BranchGRPO, TempFlowGRPO, TreeRPO
from flowrl.cli.config_checks import method_without_policy
from flowrl.config_nodes import declared_options
from flowrl.methods.tempflow_grpo import noise_aware_weights
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.sampling.sampler import sample
from flowrl.sampling.steps import get_step
from tests.methods.counting import counted_rollout
from tests.methods.test_method_layer import method_fit_args

ROOT = Path(__file__).resolve().parents[2]
BATCH = {"prompts": ["red 1 and blue 2", "green 3 and red 4"], "group_ids": torch.arange(2),
         "seeds": torch.tensor([7, 8])}


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()


@pytest.mark.parametrize("make, per_tree, leaves, edges", [
    (lambda p: TempFlowGRPO(p, num_steps=10, guidance_scale=2.0), 9 + 6 * sum(9 - k for k in range(9)), 54, 54),
    # custom branch steps: the trunk stops at the last one (6 evaluations, not T-1), completions from 3 and from 6
    (lambda p: TempFlowGRPO(p, num_steps=10, branch_steps=[2, 5], guidance_scale=2.0), 6 + 6 * (7 + 4), 12, 12),
    (lambda p: TreeRPO(p, num_steps=10, window_start=2, guidance_scale=2.0), 2 + 15 + 16 * 4, 16, 30),
    (lambda p: BranchGRPO(p, num_steps=10, guidance_scale=2.0), 1 + 2 + 2 + 4 + 4 + 8 + 8 + 16 * 3, 16, 2 * 46),
], ids=["tempflow", "tempflow_branch_steps", "tree_rpo", "branch"])
def test_nfe_counted_through_the_model_and_edges_trained_once(policy, make, per_tree, leaves, edges):
    method = make(policy)
    rollout, evaluations = counted_rollout(method, BATCH)
    assert evaluations == per_tree
    assert torch.allclose(rollout.nfe.sum(), torch.tensor(2.0 * per_tree))  # the leaves' shares add up
    assert rollout.batch_size == 2 * leaves and torch.bincount(rollout.cond_rows).tolist() == [leaves, leaves]
    assert int(rollout.trained_once().sum()) == 2 * edges  # each stochastic edge once, however many leaves below
    bytes_of = lambda t: t.numel() * t.element_size()  # noqa: E731
    buffer = bytes_of(rollout.node_latents) + bytes_of(rollout.state_index) + bytes_of(rollout.log_probs)
    assert buffer <= 1.2 * bytes_of(rollout.node_latents)  # each unique state once (+ small per-row records)


def test_tempflow_trunk_is_the_ode_sample_and_branches_reuse_its_states(policy):
    method = TempFlowGRPO(policy, num_steps=6, branches=3, guidance_scale=2.0)
    rollout, _ = counted_rollout(method, BATCH)
    cond = policy.encode(BATCH["prompts"])
    ode, _ = sample(method.generation.velocity_fn(cond), BATCH["seeds"], policy.sigmas(6), policy.latent_shape(), "ode")
    for row in range(rollout.batch_size):
        k = int(rollout.train_mask[row].nonzero())  # the one trained step: where the branch left the trunk
        tree = int(rollout.cond_rows[row])
        assert torch.allclose(rollout.states(torch.tensor([row]), torch.tensor([k]))[0], ode[tree, k], atol=1e-5)
    assert sorted(rollout.train_mask.nonzero()[:, 1].tolist()) == sorted(list(range(5)) * 3 * 2)


def test_tempflow_worked_example_advantages_and_noise_aware_weights():
    # K = 6 branches at one step: (r - 0.7) / (population std 0.1291 + 1e-4)
    rewards = torch.zeros(6, 2)
    rewards[:, 0] = torch.tensor([0.8, 0.6, 0.7, 0.9, 0.5, 0.7])
    mask = torch.zeros(6, 2, dtype=torch.bool)
    mask[:, 0] = True
    default = declared_options(TempFlowGRPO)["advantage"]  # the method's own default: step_grpo@flow_grpo
    adv = adv_lib.compute(default, rewards, mask, torch.zeros(6, dtype=torch.long))
    assert torch.allclose(adv[:, 0], torch.tensor([0.774, -0.774, 0.0, 1.548, -1.548, 0.0]), atol=1e-3)
    # SD3.5-M's schedule (T=10, shift 3), a = 0.7: the normaliser 1 / mean(s_k sqrt(dt_k)) = 2.2522
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    sigmas, steps = scheduler.sigmas.float(), torch.arange(9)
    zero = torch.zeros(9, 1)
    stds = get_step("flow_grpo")(zero, zero, sigmas[steps], sigmas[steps + 1], noise=zero,
                                 noise_level=torch.full((9,), 0.7)).std[:, 0]
    assert 1 / stds.mean() == pytest.approx(2.2522, abs=1e-3)
    expected = torch.tensor([1.5766, 1.6733, 1.2075, 1.0043, 0.8824, 0.7946, 0.7186, 0.6351, 0.5076])
    assert torch.allclose(noise_aware_weights(stds), expected, atol=1e-3)


def test_tree_rpo_window_advances_and_wraps_and_noise_grows_with_depth(policy):
    method = TreeRPO(policy, num_steps=10, window_size=4, window_start=1, window_shift_every=2, depth_noise=0.6)
    starts = []
    for batch in range(14):
        method.trainer = type("T", (), {"global_step": batch})()  # one optimizer step per batch
        starts.append(method.window())
    assert starts == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 1, 1]  # w + d <= 10: starts 1..6, then back to 1
    method.trainer = type("T", (), {"global_step": 0})()
    shape = method.tree_shape()
    assert list(shape.noise_scale[1:5]) == pytest.approx([1.0, 1.2, 1.4, 1.6]) and shape.splits[1:5] == (2,) * 4
    assert shape.sde == (False,) + (True,) * 4 + (False,) * 5 and shape.stop == 5


def test_branch_grpo_prunes_backward_passes_only(policy):
    full = BranchGRPO(policy, num_steps=6, split_steps=[0, 3], guidance_scale=2.0, step_kind="flow_grpo")
    pruned = BranchGRPO(policy, num_steps=6, split_steps=[0, 3], guidance_scale=2.0, step_kind="flow_grpo",
                        depth_pruning=[0, 1], mix_window=2)
    a, _ = counted_rollout(full, BATCH)
    b, _ = counted_rollout(pruned, BATCH)
    assert torch.equal(a.train_mask[:, 0], torch.ones(8, dtype=torch.bool)) and not b.train_mask[:, :2].any()
    assert torch.equal(b.log_probs[:, 2] == 0, torch.ones(8, dtype=torch.bool))  # mix: step 2 is the ODE
    assert torch.equal(a.states(torch.arange(8), torch.zeros(8).long()), b.states(torch.arange(8),
                                                                                   torch.zeros(8).long()))


def one_tree(method: str, *extra: str) -> str:
    """``--data.group_size`` of one tree per prompt: the leaves of ``method``'s tree at 4 steps and the options
    ``extra`` sets (the method's own ``rollout_cost``)."""
    module, _, name = method.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    options = {"num_steps": 4, **{arg.partition("=")[0].removeprefix("--model.init_args."): yaml.safe_load(
        arg.partition("=")[2]) for arg in extra if arg.startswith("--model.init_args.")}}
    return f"--data.group_size={method_without_policy(cls, options).rollout_cost()[0]}"


def tree_fit(tiny_model_dir, out, method, *extra):
    return method_fit_args(tiny_model_dir, out, method, one_tree(method, *extra), "--data.num_groups=2",
                           "--model.init_args.num_steps=4", "--model.init_args.micro_batch_size=8", *extra)


@pytest.mark.parametrize("method, option, message", [
    ("TempFlowGRPO", "--model.init_args.branches=1", "model.branches=1"),
    ("TempFlowGRPO", "--model.init_args.branch_steps=[9]", "model.branch_steps=[9]"),
    ("TreeRPO", "--model.init_args.window_start=8", "model.window_start=8"),
    ("TreeRPO", "--model.init_args.layer_tuning=-1", "model.layer_tuning=-1"),
    ("BranchGRPO", "--model.init_args.width_pruning=widest", "model.width_pruning='widest'"),
    ("BranchGRPO", "--model.init_args.advantage_group=seed", "model.advantage_group='seed'"),
])
def test_options_fail_before_any_weight_loads(tmp_path, method, option, message):
    names = {"TempFlowGRPO": "tempflow_grpo", "TreeRPO": "tree_rpo", "BranchGRPO": "branch_grpo"}
    config = ROOT / "configs" / f"tiny_{names[method]}.yaml"
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        main(["fit", "--config", str(config), option, f"--model.init_args.policy.init_args.model={tmp_path / 'no'}",
              f"--trainer.default_root_dir={tmp_path}"])
