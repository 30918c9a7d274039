"""G²RPO's rollout and credit, held to bcmi/Granular-GRPO fastvideo/train_g2rpo_hps.py (sample_reference_model: the
shared anchor, run_sde_sample_step from anchor_latents[:, eta_step], the grid sigma[:k+2] ++ sigma[k+2::g] scored at
the last input's x0; train_one_step's per-column advantages): the tree on a toy velocity by hand, the evaluations
counted through a real tiny model, the reduction to per-step GRPO, the refusals before loading, a fit of
configs/tiny_g2rpo.yaml (2 processes against 1 and exact resume: test_two_ranks_equal_one.py, test_resume.py)."""

import csv
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from flowrl import advantages as adv_lib
from flowrl.cli import main
from flowrl.cli.config_checks import method_without_policy
from flowrl.methods import G2RPO
from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import MethodOptionsError
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.rewards import JpegIncompressibility
from flowrl.sampling.tree import sample_trees
from tests.methods.counting import counted_rollout

ROOT = Path(__file__).resolve().parents[2]
BATCH = {"prompts": ["red 1 and blue 2", "green 3 and red 4"], "group_ids": torch.arange(2),
         "seeds": torch.tensor([7, 8])}


def toy_trees(T=5, members=3, granularities=(1, 2), fraction=0.5):
    """One G²RPO tree per seed (two seeds) on the toy velocity ``v(z) = z``: an Euler step from sigma to sigma' is then
    ``z (1 + sigma' - sigma)``, so every completion's grid shows in its result."""
    method = method_without_policy(G2RPO, {"num_steps": T, "branches": members, "granularities": list(granularities),
                                           "timestep_fraction": fraction})
    sigmas = torch.tensor([1.0, 0.9, 0.7, 0.5, 0.3, 0.0])[:T + 1]
    trees = sample_trees(lambda z, s, rows: z.clone(), torch.tensor([3, 4]), (2,), sigmas, method.shape_of(),
                         "flow_grpo", 0.7)
    return method, sigmas, trees


def euler_product(grid):
    return math.prod(1 + b - a for a, b in zip(grid[:-1], grid[1:]))


def test_members_share_the_anchor_then_differ_and_each_granularity_completes_on_its_grid():
    method, sigmas, trees = toy_trees()
    steps = method.branching_steps()
    assert steps == [0, 1]  # floor(5 x 0.5): the first half, as the authors' eta_step_list
    leaves = trees.tree.numel()
    assert leaves == 2 * 3 * 2 * 2 == method.rollout_cost()[0] * 2  # seeds x members x steps x granularities
    stored = lambda i, k: trees.node_latents[trees.state_index[i, k]]  # noqa: E731
    z0 = {t: stored(int((trees.tree == t).nonzero()[0]), 0) for t in (0, 1)}
    for i in range(leaves):
        tree, k = int(trees.tree[i]), int(trees.sde_mask[i].nonzero())
        anchor = z0[tree] * euler_product(sigmas[:k + 1].tolist())  # the ODE anchor up to k, shared by every member
        assert torch.allclose(stored(i, k), anchor, atol=1e-6)
        g = int(trees.granularity[i])
        # sigma[k + 1], then sigma[k + 2::g] with its last point replaced by 0 (the authors' x0 at the last input)
        grid = [sigmas[k + 1].item(), *sigmas[k + 2::g].tolist()]
        grid[-1] = 0.0
        assert torch.allclose(trees.final[i], stored(i, k + 1) * euler_product(grid), atol=1e-6)
        assert trees.nfe[i] > 0
    # T = 5, g = 2 from step k = 0: 0.9 -> 0.7 -> (0.3 replaced by) 0, 2 steps; g = 1: 4 steps
    grids = {(int(trees.sde_mask[i].nonzero()), int(trees.granularity[i])) for i in range(leaves)}
    assert grids == {(0, 1), (0, 2), (1, 1), (1, 2)}
    for tree in (0, 1):  # members differ after their step (their own noise); granularities share it
        for k in steps:
            rows = ((trees.tree == tree) & trees.sde_mask[:, k]).nonzero()[:, 0]
            nexts = torch.stack([stored(int(i), k + 1) for i in rows])
            assert len(torch.unique(nexts, dim=0)) == 3 and len(rows) == 6
            assert len(torch.unique(trees.node_ids[rows, k])) == 3  # one node per member: trained once
            assert len(torch.unique(trees.node_ids[rows, -1])) == 6  # each completion a node of its own


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()


def test_evaluations_counted_through_the_model_equal_the_cost_formula(policy):
    method = G2RPO(policy, num_steps=6, branches=3, granularities=[1, 2], guidance_scale=2.0)
    rollout, per_tree = counted_rollout(method, BATCH)
    steps = method.branching_steps()  # [0, 1, 2]
    # anchor 3 + 3 members x sum over k of (ceil((5 - k) / 1) + ceil((5 - k) / 2)) = 3 + 3 x (8 + 6 + 5) = 60
    assert per_tree == 60 == adv_lib.granular_evaluations(6, 3, steps, [1, 2], shared_anchor=True)
    assert method.rollout_cost() == (3 * 3 * 2, 60)
    assert torch.allclose(rollout.nfe.sum(), torch.tensor(2 * 60.0))
    # the authors' count evaluates the anchor to T and each member's SDE step again: 3 + 9 more
    assert adv_lib.granular_evaluations(6, 3, steps, [1, 2]) == 60 + (6 - 3) + 3 * 3
    assert int(rollout.trained_once().sum()) == 2 * 3 * 3  # each member's edge once, under its two completions


def test_one_granularity_gives_per_step_grpo_over_the_members(policy):
    method = G2RPO(policy, num_steps=4, branches=3, granularities=[1], guidance_scale=2.0, advantage_clip=None)
    rollout, _ = counted_rollout(method, BATCH)
    scores = torch.linspace(0.0, 1.0, rollout.batch_size) ** 2  # distinct, uneven
    rollout.rewards = {"jpeg_incompressibility": scores}
    method.trainer = Trainer(accelerator="cpu", logger=False, callbacks=[JpegIncompressibility()])
    batch = Batch.of(rollout, valid=torch.ones(rollout.batch_size, dtype=torch.bool))
    step_rewards = scores[:, None] * rollout.train_mask
    expected = adv_lib.compute("step_grpo@g2rpo", step_rewards, rollout.train_mask, rollout.seeds)
    torch.testing.assert_close(method.advantages(batch), expected * rollout.train_mask)


@pytest.mark.parametrize("options, says", [
    ({"granularities": [1, 1]}, "model.granularities=[1, 1]: give distinct"),
    ({"granularities": [0]}, "model.granularities=[0]"),
    ({"completion_steps": 2}, "model.completion_steps=2: G2RPO's granularities"),
    ({"reward_aggregation": "gdpo"}, "leave it at sum"),
    ({"advantage_clip": 0}, "model.advantage_clip=0"),
])
def test_options_are_refused_before_any_weight_loads(options, says):
    with pytest.raises(MethodOptionsError, match=says.replace("[", r"\[").replace("]", r"\]")):
        method_without_policy(G2RPO, {"num_steps": 4, **options})


def test_the_tiny_config_fits_on_the_embedded_model_at_its_counted_cost(tmp_path, capsys):
    # 4 steps: k = 0, 1; 2 members x 2 steps x 2 granularities = 8 leaves; 2 + 2 x ((3 + 2) + (2 + 1)) = 18 evaluations
    main(["fit", "--config", str(ROOT / "configs" / "tiny_g2rpo.yaml"), "--trainer.max_steps=1",
          "--trainer.limit_val_batches=0", "--model.init_args.num_steps=4", "--model.init_args.branches=2",
          "--data.group_size=8", "--data.num_groups=2", f"--trainer.default_root_dir={tmp_path}",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}"])
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    logged = {k: float(v) for row in rows for k, v in row.items() if v}
    assert logged["rollout/evaluations"] == 2 * 18 == 2 * adv_lib.granular_evaluations(4, 2, [0, 1], [1, 2], True)
    assert "36 model evaluations" in capsys.readouterr().out.replace(",", "")  # the run header says it before
    assert math.isfinite(logged["train/loss"])
