"""AWM's weighted flow-matching likelihood and clipped objective (``flowrl/losses/awm.py``): hand values, the ratio
on-policy, the gradient for a constant advantage, and the authors' arithmetic (loss and gradient to 1e-6)."""

import pytest
import torch

from flowrl import losses


def test_weightings_by_hand():
    v, target, t = torch.tensor([[2.0, 0.0]]), torch.zeros(1, 2), torch.tensor([0.5])  # m = -2
    values = {w: losses.flow_matching_log_likelihood(v, target, t, w, power=0.25).item() for w in losses.AWM_WEIGHTINGS}
    assert values["uniform"] == -2.0 and values["t"] == -1.0 and values["t2"] == -0.5
    assert values["huber"] == pytest.approx(-((2 + 1e-10) ** 0.5 - 1e-5) * 0.5, abs=1e-12)
    assert values["ghuber"] == pytest.approx(-((2 + 1e-10) ** 0.25 - 1e-10**0.25) * 0.5 / 0.25, abs=1e-12)
    with pytest.raises(ValueError, match="unknown AWM weighting 'huberr'"):
        losses.flow_matching_log_likelihood(v, target, t, "huberr")


def test_ratio_is_exactly_one_on_policy_and_the_gradient_is_advantage_times_the_matching_gradient():
    torch.manual_seed(0)
    v = torch.randn(3, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    target, t, adv = torch.randn(3, 2, 4, 4), torch.tensor([0.3, 0.6, 0.9]), 0.7
    log_prob = losses.flow_matching_log_likelihood(v, target, t, "ghuber")
    loss, m = losses.awm_loss(log_prob, log_prob.detach(), torch.full((3,), adv))
    assert m["ratio_min"].item() == m["ratio_max"].item() == 1.0
    (grad,) = torch.autograd.grad(loss.mean(), v)
    matching = -losses.flow_matching_log_likelihood(v, target, t, "ghuber").mean()  # the weighted FM loss
    (g_matching,) = torch.autograd.grad(matching, v)
    assert torch.allclose(grad, adv * g_matching, atol=1e-12)


def test_advantage_rescale_is_not_a_clamp():
    a = torch.tensor([-9.0, -2.5, 0.0, 4.0], dtype=torch.float64)
    assert losses.advantage_rescale(a, 5.0, 1.0).tolist() == [-1.0, -0.5, 0.0, 0.8]
    assert losses.advantage_rescale(a, 5.0, None).tolist() == [-5.0, -2.5, 0.0, 4.0]


def awm_authors_loss(model_output, model_output_old, model_output_ref, clean, noise, timesteps, advantages, config):
    """``scxue/advantage_weighted_matching`` ``advantage_weighted_matching/scripts/train_sd3_awm.py``
    (``compute_log_prob_awm`` after the transformer call, and the training loop's ``exp_first`` loss with
    ``kl_weight='Uniform'``, @be51372), written from reading it. Rows are laid out ``[K times, B samples]``."""

    def log_prob_of(out):
        lp = -(out.double() - (noise.double() - clean.double())) ** 2
        lp = lp.mean(dim=tuple(range(1, lp.ndim)))
        return -(torch.pow(-lp + 1e-10, config["p"]) - torch.pow(torch.tensor(1e-10, dtype=lp.dtype), config["p"])
                 ) * timesteps.view(-1) / config["p"]

    K, B = config["K"], config["B"]
    log_probs, old = log_prob_of(model_output).reshape(K, B), log_prob_of(model_output_old).reshape(K, B)
    adv = torch.clamp(advantages, -config["adv_clip_max"], config["adv_clip_max"])
    adv = adv / config["adv_clip_max"] * config["advantage_max"]
    ratio = torch.exp(log_probs.view(-1) - old.view(-1).detach())
    adv = adv.unsqueeze(0).repeat(K, 1).view(-1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - config["clip_range"], 1.0 + config["clip_range"])
    policy_loss = torch.mean(torch.maximum(unclipped, clipped))
    shape = (K, B, *model_output.shape[1:])
    out, ref = model_output.reshape(shape), model_output_ref.reshape(shape)
    kl = ((out - ref) ** 2).mean(dim=(2, 3, 4), keepdim=True).mean(dim=0).mean()
    return policy_loss + config["beta"] * kl


@pytest.mark.parametrize("clip_range", [1.0, 1e-3])
def test_awm_equals_the_authors_loss_and_gradient(clip_range):
    torch.manual_seed(1)
    K, B = 2, 3
    config = dict(K=K, B=B, p=0.25, adv_clip_max=5.0, advantage_max=1.0, clip_range=clip_range, beta=0.001)
    clean = torch.randn(B, 2, 4, 4, dtype=torch.float64).repeat(K, 1, 1, 1)
    noise = torch.randn(K * B, 2, 4, 4, dtype=torch.float64)
    t = torch.tensor([0.8] * B + [0.4] * B, dtype=torch.float64)
    v = torch.randn(K * B, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v_old = (v + 0.05 * torch.randn_like(v)).detach()
    v_ref = (v + 0.1 * torch.randn_like(v)).detach()
    advantages = torch.tensor([7.0, -1.0, 2.0], dtype=torch.float64)
    theirs = awm_authors_loss(v, v_old, v_ref, clean, noise, t, advantages, config)
    (g_theirs,) = torch.autograd.grad(theirs, v)

    target = noise - clean
    lp = losses.flow_matching_log_likelihood(v, target, t, "ghuber", 0.25)
    lp_old = losses.flow_matching_log_likelihood(v_old, target, t, "ghuber", 0.25)
    adv = losses.advantage_rescale(advantages, 5.0, 1.0).repeat(K)
    pair, m = losses.awm_loss(lp, lp_old, adv, clip_range)
    ours = (pair + 0.001 * (v - v_ref).square().flatten(1).mean(1)).mean()
    (g_ours,) = torch.autograd.grad(ours, v)
    if clip_range < 1:
        assert 0 < m["clip_frac"] < 1
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-6)
