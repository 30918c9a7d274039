"""The one-step gain credit (Stepwise-Flow-GRPO's reading, ``configs/tiny_step_gain.yaml``: DenseGRPO with
``completion_steps: 0`` and ``calibration: null``): a worked example on hand-made numbers from the states and
velocities to the advantages, and a fit from the command line that costs Flow-GRPO's evaluations."""

import csv
from pathlib import Path

import torch

from flowrl.cli import main
from flowrl.methods import DenseGRPO
from flowrl.methods.batch import Batch
from flowrl.sampling.completions import Completions
from flowrl.sampling.rollout import Rollout
from tests.methods.test_dense_grpo import fake_rollout, policy  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]

# two trajectories of T = 2 steps on a 1-number latent, sigmas 1 -> 0.5 -> 0; the reward of an image is its value
LATENTS = torch.tensor([[1.0, 0.8, 0.9], [-1.0, -0.2, 0.5]])  # x_0, x_1 and the final sample
VELOCITIES = torch.tensor([[0.4, -0.4], [-1.2, -0.8]])  # the sampler's own v at x_0 and x_1
SIGMAS = torch.tensor([1.0, 0.5, 0.0])


def hand_made_rollout() -> Rollout:
    return Rollout(prompts=["p", "p"], group_ids=torch.zeros(2, dtype=torch.long), seeds=torch.arange(2),
                   latents=LATENTS[..., None], log_probs=torch.zeros(2, 2), sigmas=SIGMAS.expand(2, -1),
                   train_mask=torch.ones(2, 2, dtype=torch.bool), velocities=VELOCITIES[..., None])


def test_worked_example_predictions_gains_and_advantages(policy):  # noqa: F811
    # x0_hat_k = x_k - sigma_k v_k: row 0 (1 - 0.4, 0.8 + 0.5 x 0.4) = (0.6, 1.0); row 1 (-1 + 1.2, -0.2 + 0.4) =
    # (0.2, 0.2), with no model evaluation
    rewards, evaluations = Completions(completion_steps=0).score_reused(
        hand_made_rollout(), torch.arange(2), lambda z, rows: z, lambda images, prompts, rows: images[:, 0], "ode")
    assert torch.allclose(rewards, torch.tensor([[0.6, 1.0], [0.2, 0.2]])) and evaluations.tolist() == [0, 0]
    module = DenseGRPO(policy, num_steps=2, timestep_fraction=1.0, completion_steps=0, calibration=None)
    total = LATENTS[:, -1]  # the final samples' rewards 0.9 and 0.5
    credit = module.apply_hooks(Batch.of(fake_rollout(torch.cat([rewards, total[:, None]], 1)), total=total,
                                         valid=torch.ones(2, dtype=torch.bool)))
    # gains r(x0_hat_{k+1}) - r(x0_hat_k), the last against the final sample: row 0 (0.4, -0.1), row 1 (0.0, 0.3)
    assert torch.allclose(credit.step_rewards, torch.tensor([[0.4, -0.1], [0.0, 0.3]]), atol=1e-6)
    # per step across the group: step 0 (0.4, 0.0) and step 1 (-0.1, 0.3) each have mean +-0.2 about it and a
    # population std of 0.2: +-0.2 / (0.2 + 1e-4); row 0's second step lowered its prediction and is penalised
    # although its final sample is the better one (an outcome reward would give it +1 at both steps)
    a = 0.2 / (0.2 + 1e-4)
    assert torch.allclose(credit.advantages, torch.tensor([[a, -a], [-a, a]]), atol=1e-6)


def test_the_tiny_config_fits_at_flow_grpos_cost_with_a_credit_per_step(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(["fit", "--config", "configs/tiny_step_gain.yaml", "--trainer.max_steps=1", "--trainer.logger=false",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks=[flowrl.rewards.DigitAlignment]",
          "--trainer.callbacks+=tests.cli.dump_outputs.DumpOutputs", f"--trainer.callbacks.out={tmp_path}/dump",
          "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false", "--data.num_groups=2",
          "--data.group_size=3", "--model.init_args.num_steps=3"])
    (row,) = [r for r in csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))) if r.get("rollout/evaluations")]
    assert float(row["rollout/evaluations"]) == 6 * 3  # 6 trajectories x 3 steps: no completion, no calibration
    step = torch.load(tmp_path / "dump" / "step0_rank0.pt")
    adv, trained = step["advantages"], step["advantages"][:, :2]  # floor(3 x 0.99) = 2 trained steps
    assert adv[:, 2].eq(0).all() and trained.abs().sum() > 0
    assert not torch.equal(trained[:, 0], trained[:, 1])  # a credit per step, not one per trajectory
    for gid in step["group_ids"].unique():  # each step's gains normalised across its group
        assert trained[step["group_ids"] == gid].sum(0).abs().max() < 1e-5
