"""The same estimator and loss functions train a real (tiny, random-weight) transformers causal LM on token
sequences and the tiny flow model on denoising steps: one GRPO step each, checked by hand-derived invariants."""

from typing import Callable

import pytest
import torch
from torch import Tensor

from flowrl import advantages, losses
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import sample, sde_steps, trained_steps
from flowrl.sampling.steps import get_step

VOCAB, PAD, EOS, TARGET = 16, 0, 1, 5
GROUP = 4


def grpo_step(log_probs_fn: Callable[[], Tensor], params: list[torch.nn.Parameter], adv: Tensor, mask: Tensor,
              mode: str) -> None:
    """One PPO-clip step with ``flowrl.losses`` on ``[B, T]`` log-probs, and the checks every domain must pass."""
    log_prob = log_probs_fn()  # [B, T]
    log_prob.retain_grad()
    loss, metrics = losses.policy_loss("vanilla", log_prob, log_prob.detach(), adv, mask, clip_low=0.2)
    # the first step of a rollout is on-policy: the ratio is exactly 1, nothing is clipped
    assert metrics["ratio_min"] == metrics["ratio_max"] == 1 and metrics["clip_frac"] == 0
    total = losses.aggregate(loss, mask, mode)
    total.backward()
    # at r = 1, d loss / d log_prob = -A * (the aggregation weight of the position); padding gets exactly 0
    weight = mask / mask.sum() if mode == "token-mean" else mask / mask.sum(1, keepdim=True) / mask.any(1).sum()
    assert torch.allclose(log_prob.grad, -adv * weight, atol=1e-7)
    assert (log_prob.grad[~mask] == 0).all()
    # an SGD step of length 1e-2 along -grad raises the surrogate J = sum(A * log_prob * weight) by
    # lr * |grad|^2 to first order (the loss is -J at r = 1)
    before = (adv * log_prob.detach() * weight).sum()
    squared = sum(p.grad.pow(2).sum() for p in params)
    lr = 1e-2 / squared.sqrt()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
        after = (adv * log_probs_fn() * weight).sum()
    assert after - before == pytest.approx(float(lr * squared), rel=0.2)


def test_grpo_step_on_a_tiny_causal_lm(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=PAD, bos_token_id=2, eos_token_id=EOS)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)  # the real loading path, random weights
    prompts = torch.tensor([[2, 7, 8], [2, 9, 10]])  # [P, 3], no padding needed on the left
    inputs = prompts.repeat_interleave(GROUP, 0)  # [B = 8, 3]
    group_ids = torch.arange(2).repeat_interleave(GROUP)
    torch.manual_seed(3)
    with torch.no_grad():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=True, max_new_tokens=8,
                             top_k=0, top_p=1.0, temperature=1.0, pad_token_id=PAD, eos_token_id=EOS)
    completion = out[:, inputs.shape[1]:]  # [B, T]
    # valid = up to and including the first EOS; generate right-pads after it
    mask = (torch.cumsum((completion == EOS).long(), 1) - (completion == EOS).long()) == 0  # [B, T]
    lengths = mask.sum(1)
    assert (lengths < completion.shape[1]).any() and (lengths == completion.shape[1]).any()  # padded rows exist
    # toy verifiable reward: how many TARGET tokens the completion holds, on its last valid token
    score = ((completion == TARGET) & mask).sum(1).float()  # [B]
    rewards = torch.zeros(completion.shape).index_put((torch.arange(len(score)), lengths - 1), score)
    adv = advantages.compute("grpo", rewards, mask, group_ids)  # [B, T]
    assert (adv[~mask] == 0).all() and adv.abs().sum() > 0
    for g in range(2):  # zero mean within each group (one value per completion)
        assert adv[group_ids == g, 0].sum().abs() < 1e-5

    full = torch.cat([inputs, completion], 1)
    attention = torch.cat([torch.ones_like(inputs, dtype=torch.bool), mask], 1).long()

    def token_log_probs() -> Tensor:
        logits = model(full, attention_mask=attention).logits[:, inputs.shape[1] - 1:-1]  # predicts completion
        assert torch.isfinite(losses.entropy_from_logits(logits)).all()
        return torch.log_softmax(logits.float(), -1).gather(-1, completion[..., None])[..., 0]  # [B, T]

    model.train()
    grpo_step(token_log_probs, list(model.parameters()), adv, mask, "seq-mean-token-mean")


def test_grpo_step_on_a_denoising_rollout(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()
    for p in policy.trainable_parameters():  # move LoRA off its identity start so every adapter has a gradient
        p.data.add_(0.02)
    policy.eval()
    prompts = ["red 1 and blue 2"] * 3 + ["green 3 and red 4"] * 3
    group_ids = torch.arange(2).repeat_interleave(3)
    seeds = torch.arange(10, 10 + len(prompts))
    num_steps, kind, level = 3, "flow_grpo", 0.7
    sigmas = policy.sigmas(num_steps)
    with torch.no_grad():
        cond = policy.encode(prompts)
        velocity = lambda z, s, rows: policy.velocity(z, s, cond, 1.0)  # noqa: E731
        latents, log_probs = sample(velocity, seeds, sigmas, policy.latent_shape(), kind, level)
    train = trained_steps(sde_steps(num_steps, kind), 0.99, sigmas, kind).expand(len(prompts), -1).clone()
    rollout = Rollout(prompts=prompts, group_ids=group_ids, seeds=seeds, latents=latents, log_probs=log_probs,
                      sigmas=sigmas.expand(len(prompts), -1), train_mask=train, nfe=num_steps)
    assert not rollout.train_mask[:, -1].any()  # the last step is not trained: a padded position of every row
    # toy reward on the final sample (mean latent), as the outcome on the last trained step
    score = rollout.latents[:, -1].mean(dim=(1, 2, 3))
    last = train.long().cumsum(1).argmax(1)
    rewards = torch.zeros_like(log_probs).index_put((torch.arange(len(score)), last), score)
    adv = advantages.compute("grpo", rewards, train, group_ids)
    assert (adv[~train] == 0).all() and adv.abs().sum() > 0

    def step_log_probs() -> Tensor:
        step, rows = get_step(kind), []
        for k in range(num_steps):
            if not train[:, k].any():  # untrained steps: no model call, a zero (masked) log-prob
                rows.append(torch.zeros(len(prompts)))
                continue
            z, s = rollout.latents[:, k], rollout.sigmas[:, k]
            out = step(z, policy.velocity(z, s, cond, 1.0), s, rollout.sigmas[:, k + 1],
                       z_next=rollout.latents[:, k + 1], noise_level=level)
            rows.append(torch.where(train[:, k], out.log_prob, 0.0))
        return torch.stack(rows, 1)  # [B, T]

    with torch.no_grad():  # recomputing the recorded transitions gives the sampler's log-probs
        assert torch.allclose(step_log_probs()[train], log_probs[train], atol=1e-4)
    grpo_step(step_log_probs, policy.trainable_parameters(), adv, train, "token-mean")
    assert all(p.grad is not None for p in policy.trainable_parameters())
