"""LayerTuning-RL (Dynamic-TreeRPO's ``layer_tuning``): the best leaf's path in a real tree, its weights, the term in
the update's loss by hand, a step on it alone raising the best path's likelihood, and a CLI fit that logs it. The
weights' worked examples are the doctests of flowrl/methods/layer_tuning.py."""

import math

import pytest
import torch

from flowrl.cli import main
from flowrl.methods import TreeRPO
from flowrl.methods.batch import Batch
from flowrl.losses.layer_tuning import best_path_mask
from flowrl.policies import LoraOptions, TinyFlowPolicy
from tests.cli.test_fit import load_steps
from tests.methods.counting import counted_rollout
from tests.methods.test_tree_methods import BATCH, tree_fit
from tests.policies.test_sd3 import metrics


@pytest.fixture()
def tree(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    method = TreeRPO(policy, num_steps=6, window_start=1, window_size=3, guidance_scale=2.0, layer_tuning=0.5)
    method.trainer = type("T", (), {"global_step": 0})()
    rollout, _ = counted_rollout(method, BATCH)
    rewards = torch.linspace(0, 1, rollout.batch_size)[torch.randperm(rollout.batch_size,
                                                                     generator=torch.Generator().manual_seed(0))]
    valid = torch.ones(rollout.batch_size, dtype=torch.bool)
    advantages = method.apply_hooks(Batch.of(rollout, total=rewards, valid=valid)).advantages
    return method, rollout, rewards, valid, advantages


def test_the_best_leafs_path_gets_lambda_times_its_positive_advantages(tree):
    method, rollout, rewards, valid, advantages = tree
    weights = method.supervised_weights(Batch.of(rollout, total=rewards, valid=valid, advantages=advantages))
    on_path = best_path_mask(rollout.node_ids, rewards, rollout.seeds, valid)
    for seed in rollout.seeds.unique():  # one tree per seed: 8 leaves, the best one's row holds its whole path
        rows = rollout.seeds == seed
        best = int(rows.nonzero()[rewards[rows].argmax()])
        assert on_path[best].all()  # every transition of the best leaf's row
        # the path's 3 window edges, each on every row below it: 4 + 2 + 1 rows at depths 1, 2, 3
        assert int((on_path[rows] & rollout.train_mask[rows]).sum()) == 4 + 2 + 1
    # an edge of a best path whose subtree is below its depth's mean (the best leaf in a weak subtree) is not pulled
    assert torch.equal(weights, 0.5 * advantages.clamp(min=0) * on_path)
    assert (weights > 0).sum() > 0 and (weights[~on_path] == 0).all()
    assert method.__class__(method.policy, num_steps=6, window_start=1, window_size=3).supervised_weights(
        Batch.of(rollout, total=rewards, valid=valid, advantages=advantages)) is None  # off by default


def test_the_term_is_minus_w_log_p_in_the_updates_loss(tree):
    method, rollout, rewards, valid, advantages = tree
    weights = method.supervised_weights(Batch.of(rollout, total=rewards, valid=valid, advantages=advantages))
    cond = method.policy.encode(BATCH["prompts"])
    pairs = rollout.trained_once().nonzero()
    ones = torch.ones_like(advantages)
    with torch.no_grad():
        plain, _ = method.pair_loss(rollout, cond, advantages, ones, pairs)
        both, metrics = method.pair_loss(rollout, cond, advantages, ones, pairs, weights)
        log_p = method.transition(rollout, cond, pairs).log_prob
    term = -(weights[pairs[:, 0], pairs[:, 1]] * log_p)
    assert both.item() == pytest.approx(plain.item() + term.mean().item(), rel=1e-5)
    assert metrics["supervised_loss"] == pytest.approx(term.mean().item(), rel=1e-5)


def test_a_step_on_the_term_alone_raises_the_best_paths_likelihood(tree):
    method, rollout, rewards, valid, advantages = tree
    on_path = best_path_mask(rollout.node_ids, rewards, rollout.seeds, valid) & rollout.trained_once()
    cond = method.policy.encode(BATCH["prompts"])
    pairs = on_path.nonzero()
    params = method.policy.trainable_parameters()
    optimizer = torch.optim.SGD(params, lr=10.0)  # LoRA B starts at 0: a first step moves the output little
    before = method.transition(rollout, cond, pairs).log_prob.detach()
    zero = torch.zeros_like(advantages)  # no policy-gradient signal: only the supervised term moves the weights
    loss, _ = method.pair_loss(rollout, cond, zero, torch.ones_like(zero), pairs, on_path.float())
    loss.backward()
    optimizer.step()
    after = method.transition(rollout, cond, pairs).log_prob.detach()
    assert (after > before).all(), after - before  # every best-path edge more likely


def test_a_cli_fit_logs_the_supervised_loss(tiny_model_dir, tmp_path):
    out = tmp_path / "run"  # tree_fit writes its config beside `out`, in tmp_path
    main(tree_fit(tiny_model_dir, out, "flowrl.methods.TreeRPO", "--model.init_args.window_size=2",
                  "--model.init_args.window_start=1", "--model.init_args.layer_tuning=0.5",
                  "--trainer.max_steps=2", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
                  f"--trainer.logger.save_dir={out}"))
    assert sorted(load_steps(out)) == ["step0_rank0", "step1_rank0"]
    logged = metrics(out)
    assert logged["train/supervised_loss"] != 0 and math.isfinite(logged["train/supervised_loss"])
