"""DenseGRPO on a random-weight tiny model: the issue's worked example, telescoping, NFE counted through the model,
exploration-space calibration (Alg. 1) by hand, its checkpoint round trip and resume, and option errors."""

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from flowrl.cli import main
from flowrl.data import PromptDataModule
from flowrl.methods import DenseGRPO
from flowrl.methods.batch import Batch
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.rewards import JpegIncompressibility
from flowrl.sampling.noise_calibration import NoiseCalibration, calibration_update, noise_scale_factors
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.steps import flow_grpo_step

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["red 1 and blue 2", "green 3 and red 4", "blue 5 and green 6"]
# the worked example: R before / after each step in sampling order, G=3, T=3
R = torch.tensor([[0.40, 0.50, 0.55, 0.70], [0.40, 0.35, 0.60, 0.50], [0.40, 0.45, 0.40, 0.45]])


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()


def fake_rollout(rewards: torch.Tensor) -> Rollout:
    batch, steps = rewards.shape[0], rewards.shape[1] - 1
    return Rollout(prompts=["p"] * batch, group_ids=torch.zeros(batch, dtype=torch.long),
                   seeds=torch.arange(batch), latents=torch.zeros(batch, steps + 1, 1),
                   log_probs=torch.zeros(batch, steps), sigmas=torch.linspace(1, 0, steps + 1).expand(batch, -1),
                   train_mask=torch.ones(batch, steps, dtype=torch.bool), completion_rewards=rewards[:, :-1],
                   nfe=torch.full((batch,), 2 * steps + 1))


def test_worked_example_dense_rewards_and_advantages(policy):
    module = DenseGRPO(policy, num_steps=3, timestep_fraction=1.0, calibration=None,
                       advantage_options={"eps": 0.0, "ddof": 0, "std_scope": "group"})
    rollout = fake_rollout(R)
    valid = torch.ones(3, dtype=torch.bool)
    credit = module.apply_hooks(Batch.of(rollout, total=R[:, -1], valid=valid))
    d_r = credit.step_rewards
    assert torch.allclose(d_r, torch.tensor([[0.10, 0.05, 0.15], [-0.05, 0.25, -0.10], [0.05, -0.05, 0.05]]),
                          atol=1e-6)
    adv = credit.advantages
    # step 0: dR (0.10, -0.05, 0.05), mean 0.03333, population std 0.06236 -> (1.0690, -1.3363, 0.2673)
    expected = torch.tensor([[1.0690, -0.2673, 1.1355], [-1.3363, 1.3363, -1.2978], [0.2673, -1.0690, 0.1622]])
    assert torch.allclose(adv, expected, atol=1e-4)
    # the method's default numerics (Flow-GRPO's +1e-4, population std) give the notes' second set of numbers
    default = DenseGRPO(policy, num_steps=3, timestep_fraction=1.0, calibration=None)
    adv = default.apply_hooks(Batch.of(rollout, total=R[:, -1], valid=valid)).advantages
    assert torch.allclose(adv[:, 0], torch.tensor([1.0673, -1.3342, 0.2668]), atol=1e-4)


def test_step_rewards_telescope_to_final_minus_first(policy):
    module = DenseGRPO(policy, num_steps=5, calibration=None)
    rewards = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    d_r = module.step_rewards(Batch.of(fake_rollout(rewards), total=rewards[:, -1], valid=torch.ones(4).bool()))
    assert torch.allclose(d_r.sum(1), rewards[:, -1] - rewards[:, 0], atol=1e-6)


def counted_rollout(policy, monkeypatch, **options):
    module = DenseGRPO(policy, num_steps=10, guidance_scale=2.0, calibration=None, **options)
    module.trainer = Trainer(accelerator="cpu", logger=False, callbacks=[JpegIncompressibility()])
    rows = [0]
    velocity = policy.velocity

    def counted(z, sigma, cond, guidance, *cfg_gradient):
        rows[0] += z.shape[0]  # one row of a CFG call is one evaluation (its two halves run as one batch)
        return velocity(z, sigma, cond, guidance, *cfg_gradient)

    monkeypatch.setattr(policy, "velocity", counted)
    batch = {"prompts": PROMPTS[:2], "group_ids": torch.zeros(2, dtype=torch.long), "seeds": torch.tensor([4, 5])}
    with torch.no_grad():
        rollout = module.rollout(batch, policy.encode(batch["prompts"]))
    return rollout, rows[0] / 2


def test_nfe_is_65_per_trajectory_at_ten_steps_with_full_completions(policy, monkeypatch):
    rollout, counted = counted_rollout(policy, monkeypatch)
    assert counted == 10 + sum(range(1, 11)) and rollout.nfe.tolist() == [counted] * 2  # 10 SDE steps + completions of 10..1 steps = 65
    assert rollout.completion_rewards.shape == (2, 10) and torch.isfinite(rollout.completion_rewards).all()


def test_completion_steps_cap_each_completion(policy, monkeypatch):
    rollout, counted = counted_rollout(policy, monkeypatch, completion_steps=2)
    assert counted == 10 + 2 * 9 + 1 and rollout.nfe.tolist() == [counted] * 2  # two steps each, one from the last state


def test_reused_velocity_completions_cost_no_evaluation_and_equal_a_one_step_completion(policy, monkeypatch):
    reused, counted = counted_rollout(policy, monkeypatch, completion_steps=0)
    assert counted == 10 and reused.nfe.tolist() == [10, 10]  # the sampler's own evaluations only
    one_step, counted = counted_rollout(policy, monkeypatch, completion_steps=1)
    assert counted == 10 + 10  # the same estimate, from a fresh evaluation at every state
    assert torch.allclose(reused.completion_rewards, one_step.completion_rewards, atol=1e-4)
    assert reused.velocities.shape == (2, 10, *policy.latent_shape()) and one_step.velocities is None


def test_calibration_update_by_hand():
    # notes' example: 4 positive, 3 negative, one zero at step 0 -> |1| < 2: up; 1 positive, 7 negative: down
    d_r = torch.tensor([[0.1, -0.1], [-0.2, -0.2], [0.3, -0.3], [-0.1, -0.1], [0.05, 0.05], [-0.02, -0.02],
                        [0.0, -0.01], [0.01, -0.04]])
    assert torch.allclose(calibration_update(torch.tensor([0.7, 0.7]), d_r), torch.tensor([0.71, 0.69]))
    # zeros count as neither: (+, 0, 0) is 1 vs 0 -> balanced; (+, +, 0) is 2 vs 0 -> not (strict < eps1 = 2)
    d_r = torch.tensor([[0.1, 0.1], [0.0, 0.2], [0.0, 0.0]])
    assert torch.allclose(calibration_update(torch.tensor([0.5, 0.5]), d_r), torch.tensor([0.51, 0.49]))
    # a decrease that would reach 0 is skipped; eps1 / eps2 are options
    assert torch.allclose(calibration_update(torch.tensor([0.01, 0.3]), d_r[:, [1, 1]], eps1=3, eps2=0.05),
                          torch.tensor([0.06, 0.35]))
    assert calibration_update(torch.tensor([0.01]), torch.ones(3, 1)).item() == pytest.approx(0.01)


class Scripted(DenseGRPO):
    """Calibration sees scripted rewards: R[b] per iteration, in place of sampling and scoring."""

    def __init__(self, policy, scripted, **options):
        super().__init__(policy, **options)
        self.scripted, self.seen = list(scripted), []

    def rollout_and_score(self, batch, cond):
        self.seen.append((list(batch["prompts"]), batch["seeds"].tolist(), self.noise_levels().clone()))
        rewards = self.scripted.pop(0)
        rollout = fake_rollout(rewards)
        rollout.rewards = {"jpeg_incompressibility": rewards[:, -1]}
        return rollout


def test_calibration_applies_alg1_and_the_steps_use_psi(policy):
    sigmas = policy.sigmas(3)
    factors = noise_scale_factors(sigmas, "flow_grpo")
    # iteration 1: dR = R (the worked example) diffs: step 0 (+,-,+) balanced, step 1 (+,+,-) balanced,
    # step 2 (+,-,+) balanced -> all up; iteration 2: every dR positive -> 3 vs 0 -> all down
    rising = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3)
    module = Scripted(policy, [R, rising], num_steps=3, noise_level=0.7,
                      calibration=NoiseCalibration(samples=4, iterations=2))
    module.trainer = Trainer(accelerator="cpu", logger=False, callbacks=[JpegIncompressibility()])
    assert torch.equal(module.noise_levels(), torch.full((3,), 0.7))  # Flow-GRPO's constant before calibration
    psi = module.calibrate({"prompts": PROMPTS[:2]})
    assert torch.allclose(psi, 0.7 * factors, atol=1e-6)  # +0.01 then -0.01
    assert [prompts for prompts, _, _ in module.seen] == [[PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[1]]] * 2
    first, second = module.seen[0][1], module.seen[1][1]
    assert len(set(first + second)) == 8  # fresh noise every iteration
    assert torch.allclose(module.seen[1][2] * factors, 0.7 * factors + 0.01, atol=1e-6)  # iteration 2 sampled psi+
    # the step applies psi as its scale: std = psi * sqrt(-dt)
    module.noise_scales = torch.tensor([0.9, 0.5, 0.2])
    z = torch.zeros(1, 1)
    for k in range(3):
        out = flow_grpo_step(z, z, sigmas[k], sigmas[k + 1], torch.zeros(1, 1), noise_level=module.noise_levels()[k])
        expected = module.noise_scales[k] * (sigmas[k] - sigmas[k + 1]).sqrt()
        assert out.std.item() == pytest.approx(expected.item(), rel=1e-5)


def fit(model_dir, root, steps, calibration, ckpt_path=None):
    torch.manual_seed(0)
    policy = TinyFlowPolicy(model=model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    module = DenseGRPO(policy, num_steps=3, guidance_scale=2.0, clip_range=0.2, micro_batch_size=8,
                       calibration=calibration)
    calls = []
    original = module.calibrate

    def calibrate(batch):  # records the evaluations the header predicts beside those the calibration spends
        calls.append(1)
        predicted, before = module.calibration_evaluations(), module.unlogged_evaluations
        psi = original(batch)
        module.calibration_counts = (predicted, module.unlogged_evaluations - before)
        return psi
    module.calibrate = calibrate
    trainer = Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False,
                      default_root_dir=root, callbacks=[JpegIncompressibility(), ModelCheckpoint(
                          dirpath=root, every_n_train_steps=1, save_top_k=-1)])
    trainer.fit(module, datamodule=PromptDataModule(PROMPTS, group_size=2, num_groups=2, seed=5), ckpt_path=ckpt_path)
    return module, calls


def test_calibration_is_saved_in_the_checkpoint_and_not_rerun_on_resume(tiny_model_dir, tmp_path):
    calibration = NoiseCalibration(samples=4, iterations=3, eps2=0.05)
    module, calls = fit(tiny_model_dir, tmp_path / "a", 1, calibration)
    assert calls == [1] and module.calibrated
    # the run header's count of the first batch's calibration (issue 39: it said 2,080 for 12,480): 3 iterations x 4
    # samples x (3 steps + completions of 3 + 2 + 1 steps = 9 evaluations), as the sampler counted them
    assert module.calibration_counts == (108, 108) and module.calibration_evaluations() == 0  # once calibrated: none
    initial = 0.7 * noise_scale_factors(module.policy.sigmas(3), "flow_grpo")
    moved = (module.noise_scales - initial).abs()  # three updates of +-0.05: an odd multiple of 0.05, <= 0.15
    assert ((moved - 0.05).abs() < 1e-5).logical_or((moved - 0.15).abs() < 1e-5).all()
    saved = next(Path(tmp_path / "a").glob("*step=1.ckpt"))
    state = torch.load(saved, weights_only=False)["dense_grpo"]
    assert torch.equal(state["noise_scales"], module.noise_scales) and state["calibrated"]
    resumed, calls = fit(tiny_model_dir, tmp_path / "b", 2, calibration, ckpt_path=saved)
    assert calls == [] and torch.equal(resumed.noise_scales, module.noise_scales)


def test_bad_options_fail_at_construction_with_the_key_named(policy):
    with pytest.raises(ValueError) as err:
        DenseGRPO(policy, completion_steps=-1, reward_aggregation="gdpo",
                  calibration=NoiseCalibration(samples=0, eps2=-1), advantage="nope")
    message = str(err.value)
    for part in ("model.completion_steps=-1", "reward_aggregation='gdpo'", "samples=0", "eps2=-1",
                 "model.advantage"):
        assert part in message


def test_cli_fit_with_the_tiny_config_logs_nfe(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(["fit", "--config", "configs/tiny_dense_grpo.yaml", "--trainer.max_steps=2", "--trainer.logger=false",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks=[flowrl.rewards.DigitAlignment]",
          "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false", "--data.num_groups=2",
          "--data.group_size=2", "--model.init_args.num_steps=3", "--model.init_args.calibration.samples=4",
          "--model.init_args.calibration.iterations=1"])
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    nfe = [float(r["rollout/nfe"]) for r in rows if r.get("rollout/nfe")]
    per_step = [float(r["rollout/nfe_per_trained_step"]) for r in rows if r.get("rollout/nfe_per_trained_step")]
    assert nfe == [9.0, 9.0]  # 3 SDE steps + completions of 3, 2 and 1 steps
    assert per_step == [4.5, 4.5]  # 9 evaluations per trajectory over floor(3 * 0.99) = 2 trained steps
    # the batch's evaluations: 4 trajectories x 9; the first batch also carries calibration's 4 x 9
    assert [float(r["rollout/evaluations"]) for r in rows if r.get("rollout/evaluations")] == [72.0, 36.0]
    assert all(r["train/advantage/std"] for r in rows if r.get("rollout/nfe"))


def test_cli_rejects_bad_dense_options_before_loading(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match="model.completion_steps=-1"):
        main(["fit", "--config", "configs/tiny_dense_grpo.yaml", "--model.init_args.completion_steps=-1",
              f"--model.init_args.policy.init_args.model={tmp_path / 'nope'}"])
