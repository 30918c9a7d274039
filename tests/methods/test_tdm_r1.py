"""TDM-R1 on named adapters: its draws and its old-surrogate update by hand, option errors before any weight loads,
a 2-step CLI fit of configs/tiny_tdm_r1.yaml, exact resume from a checkpoint holding every adapter, the generator's
LoRA exported for the plain diffusers pipeline (2 processes against 1: tests/methods/test_two_ranks_equal_one.py). The losses'
worked examples are in tests/losses/test_tdm.py."""

import pytest
import torch

from flowrl.cli import main
from flowrl.methods import TDMR1
from flowrl.training.adapter_steps import follow
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.policies.base import adapter_of
from tests.cli.test_fit import load_steps
from tests.methods.likelihood_free import (ROOT, assert_export_matches_pipeline, assert_resume_is_exact, option_errors,
                                           shrunk)
from tests.methods.test_method_layer import method_help

ADAPTERS = ("default", "fake_score", "surrogate", "surrogate_old")


@pytest.fixture
def method(tiny_model_dir):
    return TDMR1(TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)), time_shift=3.0).load_weights()


def adapter_params(policy, name):
    return [p for n, p in policy.denoiser.named_parameters() if adapter_of(n) == name]


def test_adapters_draws_and_the_old_surrogate_by_hand(method):
    policy = method.policy
    assert policy.adapter_names == list(ADAPTERS) and policy.active_adapter == "default"
    assert not policy.trainable_parameters("surrogate_old")
    assert all(policy.trainable_parameters(a) for a in ADAPTERS[:3])
    # surrogate_old starts as a copy of the surrogate (its random LoRA A included)
    assert all(torch.equal(o, s) for o, s in zip(adapter_params(policy, "surrogate_old"),
                                                  adapter_params(policy, "surrogate")))
    with torch.no_grad():
        for p in adapter_params(policy, "surrogate"):
            p.fill_(1.0)
        for p in adapter_params(policy, "surrogate_old"):
            p.fill_(3.0)
    follow(policy, "surrogate_old", "surrogate", 0.3)  # old <- 0.3 * 3 + 0.7 * 1 = 1.6
    assert all(torch.allclose(p, torch.full_like(p, 1.6)) for p in adapter_params(policy, "surrogate_old"))
    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    plan = method.plan(sigmas)
    again = method.plan(sigmas)  # a function of (seed, global step) alone: every rank draws the same
    assert all(torch.equal(plan[k], again[k]) for k in plan)
    steps, bounds = plan["steps"], plan["bounds"]
    assert len(steps) == 2 and len(set(steps.tolist())) == 2 and steps.max() < 4 and bounds.max() < 4
    assert (plan["fake_tau"] > sigmas[steps + 1]).all() and (plan["fake_tau"] <= 1).all()
    assert (plan["gen_tau"] >= torch.maximum(sigmas[steps + 1], torch.tensor(0.25))).all()
    assert (plan["reward_tau"] > torch.maximum(sigmas[bounds + 1], torch.tensor(0.55))).all()
    # boundaries b ~ (b + 1) / 10 over K = 4: 0.1, 0.2, 0.3, 0.4 (1000 draws over 500 seeds, within 3 std)
    draws = []
    for method.seed in range(500):
        draws.append(method.plan(sigmas)["bounds"])
    freq = torch.bincount(torch.cat(draws), minlength=4).float() / 1000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=3 * (0.25 / 1000) ** 0.5)


def test_option_errors_come_before_any_weight_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    err = option_errors("tiny_tdm_r1.yaml", tmp_path, "--model.init_args.guidance_scale=4.5",
                        "--model.init_args.tdm_weight=1.5", "--model.init_args.num_train_steps=5",
                        "--model.init_args.adapter_optimizer_options={generator: {}}",
                        "--model.init_args.generator_init=./no/such/lora",
                        "--model.init_args.policy.init_args.lora=null") + capsys.readouterr().err
    for key in ("model.guidance_scale=4.5", "model.tdm_weight=1.5", "model.num_train_steps=5", "['generator']",
                "model.generator_init='./no/such/lora'", "lora=null", f"{tmp_path}/no"):
        assert key in err, key
    with pytest.raises(ValueError, match="tdm_weight=-0.1"):
        TDMR1(None, tdm_weight=-0.1)


def test_help_shows_tdm_r1_options_and_no_ppo_options(capsys):
    options = method_help("flowrl.methods.TDMR1", capsys)
    assert {"tdm_weight", "beta_dpo", "surrogate_guidance", "generator_init", "num_train_steps"} <= set(options)
    assert not {"clip_low", "loss", "loss_options", "num_minibatches", "check_ratio", "step_kind"} & set(options)
    assert not [n for n, text in options.items() if text.startswith(("(type:", "(required"))]


def test_the_tiny_config_fits_two_steps_from_its_few_step_base(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(shrunk("tiny_tdm_r1.yaml", tmp_path))  # the embedded model, generator_init flowrl/tiny-digits-k4
    steps = load_steps(tmp_path)
    assert sorted(steps) == ["step0_rank0", "step1_rank0"]
    first = steps["step0_rank0"]
    for gid in first["group_ids"].unique():  # grpo@flow_grpo: zero mean within each group
        assert first["advantages"][first["group_ids"] == gid].sum().abs() < 1e-4
    weights = torch.load(tmp_path / "dump/weights.pt")
    for name in ("fake_score", "surrogate"):  # LoRA B starts at 0: both auxiliary adapters trained
        assert any(w.abs().sum() > 0 for k, w in weights.items() if f"lora_B.{name}." in k), name


def test_resume_is_exact_and_the_checkpoint_holds_every_adapter(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = lambda out, *extra: shrunk("tiny_tdm_r1.yaml", out, "--model.init_args.generator_init=null",  # noqa: E731
                                      *extra, model_dir=tiny_model_dir)
    checkpoint = assert_resume_is_exact(args, tmp_path, ADAPTERS)
    assert len(checkpoint["optimizer_states"]) == 3  # one optimizer per trained adapter
    assert checkpoint["global_step"] == 2  # one counted (generator) step per batch


def test_micro_batches_give_the_update_of_the_whole_batch(tiny_model_dir, tmp_path, monkeypatch):
    # the surrogate's group logits need every row before any gradient: with micro-batches of 3 rows (of 8) the
    # logits, the freeze and the per-row normalisation must give the same three updates (SGD lr 1 shows any change)
    monkeypatch.chdir(ROOT)
    common = ["--trainer.max_steps=1", "--model.init_args.generator_init=null", "--model.init_args.beta_dpo=50",
              "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.lr=1.0",
              "--model.init_args.adapter_optimizer_options={}", "--model.init_args.max_grad_norm=null"]
    main(shrunk("tiny_tdm_r1.yaml", tmp_path / "whole", *common, model_dir=tiny_model_dir))
    main(shrunk("tiny_tdm_r1.yaml", tmp_path / "micro", *common, "--model.init_args.micro_batch_size=3",
                model_dir=tiny_model_dir))
    whole, micro = torch.load(tmp_path / "whole/dump/weights.pt"), torch.load(tmp_path / "micro/dump/weights.pt")
    assert all(torch.allclose(whole[k], micro[k], rtol=1e-4, atol=1e-6) for k in whole)
    assert any(w.abs().sum() > 0 for k, w in whole.items() if "lora_B.surrogate." in k)


def test_exported_generator_lora_loads_in_the_diffusers_pipeline(sd3_dir, tmp_path):
    # the one trained adapter the export writes is the generator (default), not the fake score or the surrogate
    assert_export_matches_pipeline(tmp_path, sd3_dir, "flowrl.methods.TDMR1",
                                   "    num_train_steps: 2\n    time_shift: 3.0\n    guidance_scale: 1.0",
                                   list(ADAPTERS))
