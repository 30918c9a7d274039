"""AWM on the forward-process update: its pair loss against the pure pieces on noise rebuilt from the seeds, the ratio
exactly 1 on-policy (and the same loss through the ``old`` adapter while it equals the policy), its stratified
training times, option errors before any weight loads, a 2-step CLI fit of configs/tiny_awm.yaml and exact resume
(2 processes against 1: tests/methods/test_two_ranks_equal_one.py). The losses' own tests: tests/losses/test_awm.py."""

import pytest
import torch

from flowrl import losses
from flowrl.cli import main
from flowrl.methods import AWM
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.sampling.sampler import branch_seed, seeded_noise
from flowrl.training.adapter_steps import follow
from tests.cli.test_fit import load_steps
from tests.methods.likelihood_free import ROOT, assert_resume_is_exact, option_errors, shrunk
from tests.methods.test_diffusion_nft import adapter_params


@pytest.fixture
def method(tiny_model_dir):
    return AWM(TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)), num_steps=10).load_weights()


def pair_inputs(method):
    policy = method.policy
    torch.manual_seed(0)
    with torch.no_grad():
        for p in adapter_params(policy, "default"):
            p.add_(0.1 * torch.randn_like(p))  # the policy moved away from the reference and velocity_ema
    x0 = torch.randn(2, *policy.latent_shape())
    t, a = torch.tensor([0.8, 0.3]), torch.tensor([0.9, -0.2])
    seeds, levels = torch.tensor([5, 6]), torch.tensor([1, 4])
    return x0, t, a, policy.encode(["red 1 and blue 2", "green 3 and red 4"]), seeds, levels


def test_pair_loss_is_the_awm_loss_on_seeded_forward_noise_with_ratio_one(method):
    policy, method.beta, method.ema_beta = method.policy, 0.5, 0.25
    x0, t, a, cond, seeds, levels = pair_inputs(method)
    got = method.pair_loss(x0, t, a, cond, seeds, levels)
    eps = seeded_noise(torch.tensor([branch_seed(5, [0, 0, 1, 1]), branch_seed(6, [0, 0, 1, 4])]),
                       policy.latent_shape(), 1)[:, 0]
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v = policy.velocity(x_t, t, cond, 1.0)
    with torch.no_grad():
        with policy.reference():
            v_ref = policy.velocity(x_t, t, cond, 1.0)
        with policy.adapter("velocity_ema"):
            v_ema = policy.velocity(x_t, t, cond, 1.0)
    assert torch.equal(v_ema, v_ref)  # velocity_ema is still the initial copy: LoRA B = 0
    lp = losses.flow_matching_log_likelihood(v, eps - x0, t, "ghuber", 0.25)
    pair, m = losses.awm_loss(lp, lp.detach(), a, 1.0)
    assert m["ratio_min"].item() == m["ratio_max"].item() == 1.0  # on-policy: exactly 1
    want = pair + 0.5 * (v - v_ref).square().flatten(1).mean(1) + 0.25 * (v - v_ema).square().flatten(1).mean(1)
    torch.testing.assert_close(got.detach(), want.detach().float())
    # the gradient of the policy term is the advantage times the weighted flow-matching gradient
    (g_got,) = torch.autograd.grad(pair.sum(), v, retain_graph=True)
    (g_fm,) = torch.autograd.grad(-(a.double() * lp).sum(), v)
    torch.testing.assert_close(g_got, g_fm)


def test_the_old_adapter_gives_the_same_loss_while_it_equals_the_policy(method):
    x0, t, a, cond, seeds, levels = pair_inputs(method)
    follow(method.policy, "old", "default", 0.0)  # old is a copy of the moved policy
    on_policy = method.pair_loss(x0, t, a, cond, seeds, levels)
    method.num_minibatches = 2  # old's forward is taken: later minibatches are off-policy
    through_old = method.pair_loss(x0, t, a, cond, seeds, levels)
    assert torch.equal(on_policy, through_old)


def test_training_times_are_one_per_stratum(method):
    # T = 10, fraction 0.9: strata of linspace(1, 9, 7).long() = [1, 2, 3, 5, 6, 7, 9]
    ids = torch.stack([method.level_ids(torch.tensor(s), 10, 6) for s in range(50)])
    lower, upper = torch.tensor([1, 2, 3, 5, 6, 7]), torch.tensor([2, 3, 5, 6, 7, 9])
    assert ((ids >= lower) & (ids < upper)).all() and method.times_per_sample(10) == 6
    assert len({tuple(row.tolist()) for row in ids}) > 1  # each sample its own draw


def test_sample_targets_rescale_and_zero_where_no_reward(method):
    got = method.sample_targets(torch.tensor([7.0, 2.5, 1.0]), torch.tensor([True, True, False]))
    assert got.tolist() == [1.0, 0.5, 0.0]


def test_option_errors_come_before_any_weight_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    err = option_errors("tiny_awm.yaml", tmp_path, "--model.init_args.weighting=huberr",
                        "--model.init_args.clip_range=2", "--model.init_args.num_train_times=0",
                        "--model.init_args.ema_beta=-1", "--model.init_args.step_kind=ddim")
    for key in ("model.weighting='huberr'", "model.clip_range=2", "model.num_train_times=0", "model.ema_beta=-1",
                "model.step_kind='ddim'"):
        assert key in err, key
    with pytest.raises(ValueError, match="ghuber_power=0"):
        AWM(None, ghuber_power=0)


def test_the_tiny_config_fits_two_steps_and_both_followers_move(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(shrunk("tiny_awm.yaml", tmp_path))
    assert sorted(load_steps(tmp_path)) == ["step0_rank0", "step1_rank0"]
    weights = torch.load(tmp_path / "dump/weights.pt")
    for name in ("default", "old", "velocity_ema"):  # old copies the policy; velocity_ema follows it at 0.001 n
        assert any(w.abs().sum() > 0 for k, w in weights.items() if f"lora_B.{name}." in k), name


def test_resume_is_exact(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = lambda out, *extra: shrunk("tiny_awm.yaml", out, "--model.init_args.num_minibatches=2",  # noqa: E731
                                      "--model.init_args.micro_batch_size=5", *extra, model_dir=tiny_model_dir)
    checkpoint = assert_resume_is_exact(args, tmp_path, ("default", "old", "velocity_ema"))
    assert checkpoint["global_step"] == 2
