"""``cfg_gradient``: which halves of classifier-free guidance carry the policy gradient. ``cond`` (flow_grpo's
``noise_pred_uncond.detach()``) must give exactly the gradient of the detached form, with the unconditional forward
run without a graph; ``both`` the gradient through both halves; sampling (no gradient) is one batch either way."""

import pytest
import torch

from flowrl.policies import Conditioning, LoraOptions, TinyFlowPolicy

G = 3.0  # guidance scale


@pytest.fixture(scope="module")
def case(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()
    torch.manual_seed(0)
    for p in policy.trainable_parameters():  # LoRA B starts at 0: give both factors values, so gradients are general
        p.data.normal_(0, 0.05)
    cond = policy.encode(["red 3 and blue 7", "green 1 and red 2"])  # 2 rows
    z, sigma = torch.randn(2, 3, 16, 16), torch.tensor([0.9, 0.4])
    target = torch.randn(2, 3, 16, 16)
    return policy, cond, z, sigma, target


def gradients(policy, loss_of) -> list[torch.Tensor]:
    params = policy.trainable_parameters()
    return list(torch.autograd.grad(loss_of(), params))


def test_cond_equals_the_detached_form_and_both_the_full_gradient(case):
    policy, cond, z, sigma, target = case

    def detached():  # flow_grpo's compute_log_prob: one batch of both halves, the unconditional one detached
        both = policy._forward(torch.cat([z, z]), torch.cat([sigma, sigma]),
                               Conditioning.cat([cond.unconditional(), cond.conditional()]))
        v_u, v_c = both.chunk(2)
        v_u = v_u.detach()
        return ((v_u + G * (v_c - v_u) - target) ** 2).mean()

    def full():
        both = policy._forward(torch.cat([z, z]), torch.cat([sigma, sigma]),
                               Conditioning.cat([cond.unconditional(), cond.conditional()]))
        v_u, v_c = both.chunk(2)
        return ((v_u + G * (v_c - v_u) - target) ** 2).mean()

    cond_grads = gradients(policy, lambda: ((policy.velocity(z, sigma, cond, G, "cond") - target) ** 2).mean())
    both_grads = gradients(policy, lambda: ((policy.velocity(z, sigma, cond, G, "both") - target) ** 2).mean())
    for mine, ref in zip(cond_grads, gradients(policy, detached)):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-7)
    for mine, ref in zip(both_grads, gradients(policy, full)):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-7)
    # the two differ: the unconditional half's gradient, (1 - g) dv_u, is as large as the conditional's here
    gap = sum((a - b).norm() for a, b in zip(cond_grads, both_grads)) / sum(b.norm() for b in both_grads)
    assert gap > 0.1


def test_cond_runs_the_unconditional_forward_without_a_graph(case):
    policy, cond, z, sigma, _ = case
    calls = []
    forward = policy._forward

    def recording(latents, sigma_, side):
        out = forward(latents, sigma_, side)
        calls.append((len(latents), side.embeds is cond.null_embeds, torch.is_grad_enabled(), out.requires_grad))
        return out

    policy._forward = recording
    try:
        policy.velocity(z, sigma, cond, G, "cond")
        assert calls == [(2, True, False, False), (2, False, True, True)]  # uncond: no graph; cond: the gradient
        calls.clear()
        policy.velocity(z, sigma, cond, G, "both")
        assert calls == [(4, False, True, True)]  # one batch of both halves
        calls.clear()
        with torch.no_grad():  # sampling: one batch whatever the option
            policy.velocity(z, sigma, cond, G)
        assert calls == [(4, False, False, False)]
    finally:
        del policy._forward
