"""The SD1.5 adapter (epsilon prediction, DDIM) on a tiny random-weight StableDiffusionPipeline loaded through
from_pretrained: the pipeline's encodings and timesteps, its ODE sample bit-for-bit in float32, step-kind checks
before loading, and a one-step DDPO-style fit (LoRA and full) that is on-policy and resumes."""

import csv
from pathlib import Path

import pytest
import torch
from diffusers import DDIMScheduler, StableDiffusionPipeline

from flowrl.cli import main
from flowrl.methods import FlowGRPO
from tests.methods.options import option_problems
from flowrl.policies import LoraOptions, SD15Policy
from flowrl.sampling.steps import ddim_step
from flowrl.sampling.sampler import seeded_noise
from tests.policies.mixed_precision import assert_mixed_precision
from tests.policies.tiny_pipelines import CLIP_LENGTH

HERE = Path(__file__).resolve().parent
LORA = LoraOptions(rank=4, alpha=8)


def sd15(path, **kw):
    return SD15Policy(path, **{"lora": LORA, "resolution": 32, **kw}).load()


def ddim_pipeline(path):
    """The plain diffusers pipeline with the DDIM scheduler, converted from the saved PNDM config as DDPO does."""
    pipe = StableDiffusionPipeline.from_pretrained(path)
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    return pipe


def test_encodings_timesteps_and_sigmas_are_the_pipelines(sd15_dir):
    policy, pipe = sd15(sd15_dir), ddim_pipeline(sd15_dir)
    cond = policy.encode(["a red cat", "a blue dog"])
    want, neg = pipe.encode_prompt(["a red cat", "a blue dog"], "cpu", 1, True)
    assert cond.embeds.shape == (2, CLIP_LENGTH, 32) and cond.pooled.shape == (2, 0)
    torch.testing.assert_close(cond.embeds, want)
    torch.testing.assert_close(cond.null_embeds, neg)
    pipe.scheduler.set_timesteps(5)  # leading spacing, offset 1: 801, 601, 401, 201, 1
    assert pipe.scheduler.timesteps.tolist() == [801, 601, 401, 201, 1]
    sigmas = policy.sigmas(5)
    alphas = pipe.scheduler.alphas_cumprod
    final = pipe.scheduler.final_alpha_cumprod  # alphas_cumprod[0]: SD1.5 sets set_alpha_to_one false
    expected = [((1 - a) / a).sqrt().item() for a in [*alphas[[801, 601, 401, 201, 1]].double(), final.double()]]
    assert sigmas.tolist() == pytest.approx(expected, rel=1e-6)
    assert policy.timesteps(sigmas[:-1]).tolist() == [801, 601, 401, 201, 1]
    assert policy.latent_shape() == (4, 16, 16) and policy.prediction == "epsilon"


def test_ode_sample_equals_the_diffusers_pipeline(sd15_dir):
    """Same start latents, 4 DDIM steps with eta 0 and CFG 3: the loop's ``generate`` is the pipeline's output."""
    policy = sd15(sd15_dir, lora=None, vae_chunk_size=1)
    loop = FlowGRPO(policy, step_kind="ddim", noise_level=1.0, guidance_scale=3.0)
    seeds, prompts = torch.tensor([4, 9]), ["a red cat", "a green tree"]
    images = loop.generation.generate(prompts, seeds, num_steps=4)
    start = seeded_noise(seeds, (4, 16, 16), 5)[:, 0]  # the sampler's start latents
    want = ddim_pipeline(sd15_dir)(prompts, height=32, width=32, num_inference_steps=4, guidance_scale=3.0,
                                   eta=0.0, latents=start, output_type="pt").images
    assert images.shape == (2, 3, 32, 32)
    torch.testing.assert_close(images, want, atol=2e-6, rtol=0)


def test_mixed_precision_keeps_trained_weights_and_epsilon_in_float32(sd15_dir):
    policy = sd15(sd15_dir, torch_dtype="bfloat16", autocast="bfloat16", gradient_checkpointing=True)
    assert_mixed_precision(policy, sd15(sd15_dir), policy.sigmas(5)[1:2], 3.0)  # the UNet's epsilon, checkpointed


def test_ddim_rollout_replays_through_the_policy(sd15_dir):
    """A stochastic (eta 1) rollout's recorded log-probs are recomputed by the step on the recorded states."""
    policy = sd15(sd15_dir)
    loop = FlowGRPO(policy, step_kind="ddim", noise_level=1.0, num_steps=3, guidance_scale=2.0,
                    timestep_fraction=1.0)
    batch = {"prompts": ["a red cat", "a blue dog"], "seeds": torch.tensor([1, 2]), "group_ids": torch.tensor([0, 0])}
    cond = policy.encode(batch["prompts"])
    with torch.no_grad():
        rollout = loop.rollout(batch, cond)
        k = 1
        z, z_next = rollout.latents[:, k], rollout.latents[:, k + 1]
        eps = policy.velocity(z, rollout.sigmas[:, k], cond, 2.0)
        again = ddim_step(z, eps, rollout.sigmas[:, k], rollout.sigmas[:, k + 1], z_next=z_next, noise_level=1.0)
    assert rollout.train_mask.all() and (rollout.log_probs != 0).all()
    assert torch.allclose(again.log_prob, rollout.log_probs[:, k], atol=1e-6)


def test_step_kind_must_read_what_the_policy_predicts(tmp_path, sd15_dir):
    sd15_config = SD15Policy(sd15_dir, resolution=32)  # built from its configs: no weight loads
    [problem] = option_problems(FlowGRPO, step_kind="flow_grpo", policy=sd15_config)
    assert "reads the model output as a velocity, but the policy predicts epsilon" in problem and "['ddim']" in problem
    [problem] = option_problems(FlowGRPO, step_kind="ddim", policy={"class_path": "flowrl.policies.TinyFlowPolicy"})
    assert "predicts velocity; choose a step kind from ['cps', 'dance', 'flow_grpo']" in problem
    assert option_problems(FlowGRPO, step_kind="ddim_ode", policy=sd15_config)  # deterministic: nothing to train
    assert not option_problems(FlowGRPO, step_kind="ddim", policy=sd15_config)
    # through the CLI, before the (missing) model would load
    with pytest.raises(SystemExit, match="model.step_kind='flow_grpo' reads the model output as a velocity"):
        main(["fit", "--config", str(HERE / "fit_sd15.yaml"), "--model.init_args.step_kind=flow_grpo",
              f"--model.init_args.policy.init_args.model={tmp_path / 'nope'}"])


def test_bad_options_fail_clearly(sd15_dir):
    # VAE factor 2 x two UNet down blocks (one downsampling): a multiple of 4
    with pytest.raises(ValueError, match="policy.resolution=30 must be a positive multiple of 4"):
        sd15(sd15_dir, resolution=30)


def metrics(out):
    rows = list(csv.DictReader(open(next(Path(out).rglob("metrics.csv")))))
    return {k: float(v) for row in rows for k, v in row.items() if v}


def fit_args(model_dir, out, layers, *rest):
    """``layers``: more arguments right after ``fit_sd15.yaml`` (``lora=null`` on the command line: full fine-tuning;
    flowrl.cli passes it on as a config layer, since jsonargparse would hand the policy the string 'None')."""
    return ["fit", "--config", str(HERE / "fit_sd15.yaml"), *layers,
            f"--model.init_args.policy.init_args.model={model_dir}", f"--trainer.default_root_dir={out}",
            f"--trainer.logger.init_args.save_dir={out}", *rest]


@pytest.mark.parametrize("layers", [[], ["--model.init_args.policy.init_args.lora=null"]], ids=["lora", "full"])
def test_fit_one_step_is_on_policy_and_resumes(sd15_dir, tmp_path, layers):
    ckpt = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps=1", "--trainer.callbacks.save_top_k=-1"]
    main(fit_args(sd15_dir, tmp_path / "a", layers, *ckpt))
    logged = metrics(tmp_path / "a")
    assert logged["train/check_ratio_max_dev"] < 1e-5  # fp32 on CPU: the recomputed DDIM log-probs match
    assert logged["train/kl"] >= 0 and "train/reward/total" in logged
    saved = next(Path(tmp_path / "a").rglob("*step=1.ckpt"))
    state = torch.load(saved, weights_only=False)["state_dict"]
    trained = [k for k in state if k.startswith("policy.denoiser.")]
    assert trained and all(("lora_" in k) == (not layers) for k in trained)
    main(fit_args(sd15_dir, tmp_path / "b", layers, "--trainer.max_steps=2", f"--ckpt_path={saved}"))
    assert "train/reward/total" in metrics(tmp_path / "b")
