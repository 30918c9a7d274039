"""The SD3 / SD3.5 adapter on a tiny random-weight StableDiffusion3Pipeline loaded through from_pretrained."""

import csv
from pathlib import Path

import pytest
import torch
from diffusers import StableDiffusion3Pipeline

from flowrl.cli import main
from flowrl.policies import LoraOptions, SD3Policy
from tests.policies.mixed_precision import assert_mixed_precision
from tests.policies.tiny_pipelines import CLIP_LENGTH

HERE = Path(__file__).resolve().parent
LORA = LoraOptions(rank=4, alpha=8)


def sd3(path, **kw):
    return SD3Policy(path, **{"lora": LORA, "resolution": 32, "max_sequence_length": 8, **kw}).load()


def test_encoding_is_the_pipelines_and_is_cached_per_prompt(sd3_dir, monkeypatch):
    policy = sd3(sd3_dir)
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    prompts = ["a red cat", "a blue dog", "a red cat"]
    want, neg, want_pooled, neg_pooled = pipe.encode_prompt(prompts, None, None, do_classifier_free_guidance=True,
                                                            max_sequence_length=8)
    calls = []
    encode_batch = policy._encode_batch
    monkeypatch.setattr(policy, "_encode_batch", lambda p: calls.append(list(p)) or encode_batch(p))
    cond = policy.encode(prompts)
    assert calls == [["a red cat", "a blue dog"], [""]]  # each distinct prompt once, then the empty prompt
    # [B, 16 CLIP tokens + 8 T5 tokens, 32], pooled [B, 16 + 16]
    assert cond.embeds.shape == (3, CLIP_LENGTH + 8, 32) and cond.pooled.shape == (3, 32)
    torch.testing.assert_close(cond.embeds, want)
    torch.testing.assert_close(cond.pooled, want_pooled)
    torch.testing.assert_close(cond.null_embeds, neg)
    torch.testing.assert_close(cond.null_pooled, neg_pooled)
    policy.encode(["a blue dog", "a red cat"])
    assert len(calls) == 2  # all cached


def test_without_t5_the_t5_part_is_zeros(sd3_dir):
    policy = sd3(sd3_dir, text_encoder_3=False)
    assert policy.text_encoder_3 is None
    cond = policy.encode(["a red cat"])
    assert cond.embeds.shape == (1, CLIP_LENGTH + 8, 32)
    assert cond.embeds[:, CLIP_LENGTH:].abs().max() == 0 and cond.embeds[:, :CLIP_LENGTH].abs().max() > 0


def test_velocity_cfg_latents_sigmas_and_decode(sd3_dir):
    policy = sd3(sd3_dir, vae_chunk_size=2)
    cond = policy.encode(["a red cat", "a blue dog", "a green tree"])
    assert policy.latent_shape() == (4, 16, 16)  # 32 px / VAE factor 2
    z, sigma = torch.randn(3, 4, 16, 16), torch.tensor([0.9, 0.5, 0.2])
    with torch.no_grad():
        v_c = policy.velocity(z, sigma, cond, 1.0)
        v_u = policy._forward(z, sigma, cond.unconditional())
        torch.testing.assert_close(policy.velocity(z, sigma, cond, 4.5), v_u + 4.5 * (v_c - v_u))
        images = policy.decode(z)
        whole = sd3(sd3_dir).decode(z)  # one chunk
    assert images.shape == (3, 3, 32, 32) and 0 <= images.min() and images.max() <= 1
    torch.testing.assert_close(images, whole)
    # diffusers' grid with shift 3, shift(s) = 3 s / (1 + 2 s): s evenly spaced from 1 to the training grid's
    # smallest sigma, shift(1/1000) = 0.002994, then shifted (again), and a final 0
    s = torch.linspace(1.0, 3e-3 / (1 + 2e-3), 4)
    torch.testing.assert_close(policy.sigmas(4), torch.cat([3 * s / (1 + 2 * s), torch.zeros(1)]))


def test_bad_options_fail_before_the_transformer_loads(sd3_dir):
    with pytest.raises(ValueError, match="policy.resolution=30 must be a positive multiple of 4"):
        sd3(sd3_dir, resolution=30)
    with pytest.raises(ValueError, match="policy.torch_dtype='bf16': choose one of"):
        sd3(sd3_dir, torch_dtype="bf16")


def test_mixed_precision_keeps_trained_weights_and_velocities_in_float32(sd3_dir):
    policy = sd3(sd3_dir, torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    assert_mixed_precision(policy, sd3(sd3_dir), torch.tensor([0.7]), 2.0)


def test_checkpoints_hold_only_trained_weights_and_load_back(sd3_dir):
    policy = sd3(sd3_dir)
    state = policy.state_dict()
    assert state and all("lora_" in k for k in state)
    for value in state.values():
        value.add_(0.5)
    fresh = sd3(sd3_dir)
    fresh.load_state_dict(state)  # strict: frozen weights are not "missing"
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    full = sd3(sd3_dir, lora=None)
    full.setup_reference()
    assert set(full.state_dict()) == {n for n, p in full.denoiser.named_parameters(prefix="denoiser")}
    with pytest.raises(RuntimeError, match="Missing key"):
        sd3(sd3_dir).load_state_dict({})


def metrics(out):
    rows = list(csv.DictReader(open(next(Path(out).rglob("metrics.csv")))))
    return {k: float(v) for row in rows for k, v in row.items() if v}


def fit_args(model_dir, out, *extra, policy="flowrl.policies.SD3Policy"):
    """``fit_pipeline.yaml`` with the policy's class and model; ``extra`` may layer further ``--config`` files."""
    configs = [a for i, a in enumerate(extra) if a == "--config" or (i and extra[i - 1] == "--config")]
    rest = [a for a in extra if a not in configs]
    return ["fit", "--config", str(HERE / "fit_pipeline.yaml"), *configs,
            f"--model.init_args.policy.class_path={policy}", f"--model.init_args.policy.init_args.model={model_dir}",
            f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}", *rest]


@pytest.mark.parametrize("layers", [[], ["--config", str(HERE / "full_finetune.yaml")]], ids=["lora", "full"])
def test_fit_one_step_is_on_policy_and_resumes(sd3_dir, tmp_path, layers):
    ckpt = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps=1", "--trainer.callbacks.save_top_k=-1"]
    main(fit_args(sd3_dir, tmp_path / "a", *layers, "--model.init_args.beta=0.04", *ckpt))
    logged = metrics(tmp_path / "a")
    assert logged["train/check_ratio_max_dev"] < 1e-5  # fp32 on CPU: the recomputed log-probs match
    assert "train/kl" in logged
    saved = next(Path(tmp_path / "a").rglob("*step=1.ckpt"))
    main(fit_args(sd3_dir, tmp_path / "b", *layers, "--model.init_args.beta=0.04", "--trainer.max_steps=2",
                  f"--ckpt_path={saved}"))
    assert "train/reward/total" in metrics(tmp_path / "b")
