"""TPGRPO on a random-weight tiny model: the window rollout, R_0 from the trajectory's own noise, real NFE counts,
option errors and a 2-step CLI fit of the tiny config (2 processes against 1: tests/methods/test_two_ranks_equal_one.py)."""

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from flowrl.cli import main
from flowrl.methods import TPGRPO
from flowrl.rewards import FunctionReward
from flowrl.policies import LoraOptions, TinyFlowPolicy
from tests.cli.test_fit import load_steps
from tests.methods.counting import counted_rollout

ROOT = Path(__file__).resolve().parent.parent.parent
CONFIG = str(ROOT / "configs" / "tiny_tp_grpo.yaml")
# a reward with O(1) spread on a random-weight model, so turning points of both signs occur and balancing acts
BRIGHTNESS = ("{class_path: flowrl.rewards.FunctionReward, init_args: {function: "
              "tests.rewards.reward_functions.brightness}}")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    torch.manual_seed(0)
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()


def batch_of(seeds):
    prompts = ["red 1 and blue 2", "green 3 and red 4"][: len(seeds)]
    return {"prompts": prompts, "group_ids": torch.arange(len(seeds)), "seeds": torch.tensor(seeds)}


def mean_pixel(images, prompts):
    return images.mean(dim=(1, 2, 3))


def scored_by_mean_pixel(module):
    """``module`` on a trainer whose one reward is the mean pixel (what its completions are scored with)."""
    module.trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[
        FunctionReward("tests.rewards.reward_functions.brightness")])
    return module


def test_nfe_is_64_at_ten_steps_with_a_nine_step_window(policy):
    module = scored_by_mean_pixel(TPGRPO(policy, num_steps=10, window_size=9, guidance_scale=4.5))
    rollout, evaluations = counted_rollout(module, batch_of([3, 4]))
    assert evaluations == 64 and rollout.nfe.tolist() == [64, 64]  # 10 sample + sum_{j=0..8} (10 - j) completion evaluations
    module = scored_by_mean_pixel(TPGRPO(policy, num_steps=6, window_start=1, window_size=3, guidance_scale=4.5,
                                         completion_steps=2))
    rollout, evaluations = counted_rollout(module, batch_of([3]))
    assert evaluations == 6 + 2 + 2 + 2 and rollout.nfe.tolist() == [evaluations]


@pytest.mark.parametrize("step_kind", ["cps", "flow_grpo"])
def test_window_rollout_and_r0_from_the_same_noise(policy, step_kind):
    module = scored_by_mean_pixel(TPGRPO(policy, num_steps=6, window_start=2, window_size=4, step_kind=step_kind,
                                         guidance_scale=2.0))
    seeds = [11, 12]
    rollout, _ = counted_rollout(module, batch_of(seeds))
    window = torch.zeros(6, dtype=torch.bool)
    window[2:6] = True
    assert torch.equal(rollout.log_probs != 0, window.expand(2, -1))  # SDE exactly on the window steps
    # CPS landing on sigma 0 has no log-prob: the last window step is not trained there
    trained = window.clone()
    trained[5] = step_kind != "cps"
    assert torch.equal(rollout.train_mask, trained.expand(2, -1))
    assert rollout.completion_rewards.shape == (2, 4) and torch.isfinite(rollout.completion_rewards).all()
    # before the window the trajectory is the ODE, so R_0 (completion of the latent at the window start) is the
    # reward of the plain ODE sample of the same seed
    ode_images = module.generation.generate(batch_of(seeds)["prompts"], torch.tensor(seeds), num_steps=6)
    assert torch.allclose(rollout.completion_rewards[:, 0], mean_pixel(ode_images, None), atol=1e-5)
    # another seed gives another baseline: the baseline is the trajectory's own, not a fresh draw
    other = module.generation.generate(batch_of(seeds)["prompts"], torch.tensor([13, 14]), num_steps=6)
    assert not torch.allclose(rollout.completion_rewards[:, 0], mean_pixel(other, None), atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"window_start": 2, "window_size": 9}, "model.window_start=2, model.window_size=9"),
    ({"window_size": 0}, "model.window_size=0"),
    ({"first_step": "always"}, "model.first_step='always'"),
    ({"reward_aggregation": "gdpo"}, "use reward_aggregation: sum"),
    ({"completion_steps": -1}, "model.completion_steps=-1"),
    ({"step_kind": "ode"}, "model.step_kind='ode'"),
])
def test_bad_options_fail_clearly(policy, options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        TPGRPO(policy, num_steps=10, **options)


def fit_args(model_dir, out, *extra):
    return ["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={model_dir}",
            f"--trainer.default_root_dir={out}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false", "--trainer.limit_val_batches=0", "--trainer.max_steps=2",
            f"--trainer.callbacks=[{BRIGHTNESS}, tests.cli.dump_outputs.DumpOutputs]",
            f"--trainer.callbacks.out={out}/dump", "--model.init_args.num_steps=4", "--model.init_args.window_size=3",
            "--model.init_args.guidance_scale=2.0", "--model.init_args.micro_batch_size=4",
            "--data.prompts=[red 1 and blue 2, green 3 and red 4, blue 5 and green 6, red 7 and red 8]",
            "--data.group_size=4", "--data.num_groups=2", *extra]


def test_two_step_fit_of_the_tiny_config(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(fit_args(tiny_model_dir, tmp_path))
    steps = load_steps(tmp_path)
    assert sorted(steps) == ["step0_rank0", "step1_rank0"]
    adv = steps["step0_rank0"]["advantages"]
    # window [0, 3) of 4 steps; CPS's step 2 lands on sigma > 0 and is trained, step 3 is outside the window
    assert adv.shape == (8, 4) and (adv[:, 3] == 0).all() and adv[:, :3].abs().sum() > 0
    for g in steps["step0_rank0"]["group_ids"].unique():  # per (group, step) normalisation
        rows = steps["step0_rank0"]["group_ids"] == g
        assert torch.allclose(adv[rows, :3].sum(0), torch.zeros(3), atol=1e-4)
    weights = torch.load(tmp_path / "dump/weights.pt")
    assert any(w.abs().sum() > 0 for k, w in weights.items() if "lora_B" in k)


def test_config_error_names_the_window_before_loading(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match="model.window_start=0, model.window_size=5"):
        main(fit_args(str(tmp_path / "no-model-here"), tmp_path, "--model.init_args.window_size=5"))
