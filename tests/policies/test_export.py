"""Export for diffusers: LoRA weights that the plain pipeline loads with ``load_lora_weights`` reproduce the adapter's
ODE samples; merged and fully fine-tuned pipelines load with ``from_pretrained``; ``python -m flowrl export`` works
from a fit checkpoint."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from diffusers import FluxPipeline, StableDiffusion3Pipeline
from peft.utils import get_peft_model_state_dict

from flowrl.cli import main
from flowrl.methods import FlowGRPO
from flowrl.policies import FluxPolicy, LoraOptions, SD3Policy
from flowrl.policies.export import export_lora, export_pipeline
from flowrl.sampling.sampler import seeded_noise
from tests.policies.test_sd3 import fit_args

PROMPTS, SEEDS, STEPS = ["a red cat", "a blue dog"], torch.tensor([11, 12]), 3
FAMILIES = {"sd3": (SD3Policy, StableDiffusion3Pipeline, 3.0), "flux": (FluxPolicy, FluxPipeline, 3.5)}


def trained_policy(family, path, lora=LoraOptions(rank=4, alpha=8)):
    policy_class, _, _ = FAMILIES[family]
    policy = policy_class(path, lora=lora, resolution=32, max_sequence_length=8).load()
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy


def pipeline_images(family, pipe, policy):
    _, _, guidance = FAMILIES[family]
    noise = seeded_noise(SEEDS, policy.latent_shape(), 1)[:, 0]  # the rollout's initial noise
    if family == "flux":
        noise = FluxPipeline._pack_latents(noise, len(SEEDS), *policy.latent_shape())
    return pipe(PROMPTS, num_inference_steps=STEPS, guidance_scale=guidance, latents=noise, height=32, width=32,
                output_type="pt", max_sequence_length=8).images


@pytest.fixture
def model_dir(request, sd3_dir, flux_dir):
    return {"sd3": sd3_dir, "flux": flux_dir}[request.param]


@pytest.mark.parametrize("family,model_dir", [("sd3", "sd3"), ("flux", "flux")], indirect=["model_dir"])
def test_exported_lora_and_merged_pipeline_reproduce_the_adapters_ode_sample(family, model_dir, tmp_path):
    policy = trained_policy(family, model_dir)
    _, pipeline_class, guidance = FAMILIES[family]
    ours = FlowGRPO(policy, guidance_scale=guidance).generation.generate(PROMPTS, SEEDS, STEPS)
    export_lora(policy, tmp_path / "lora")
    pipe = pipeline_class.from_pretrained(model_dir)
    base = pipeline_images(family, pipe, policy)
    pipe.load_lora_weights(tmp_path / "lora")
    with_lora = pipeline_images(family, pipe, policy)
    assert (base - ours).abs().max() > 1e-3  # the LoRA matters, so the match below is the LoRA's
    torch.testing.assert_close(with_lora, ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    merged = pipeline_images(family, pipeline_class.from_pretrained(tmp_path / "merged"), policy)
    torch.testing.assert_close(merged, ours, atol=1e-5, rtol=1e-4)


def test_full_finetuning_exports_the_whole_pipeline(sd3_dir, tmp_path):
    policy = trained_policy("sd3", sd3_dir, lora=None)
    with pytest.raises(ValueError, match="fully fine-tuned"):
        export_lora(policy, tmp_path / "lora")
    export_pipeline(policy, tmp_path / "full")
    loaded = StableDiffusion3Pipeline.from_pretrained(tmp_path / "full").transformer.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in policy.denoiser.state_dict().items())


def test_export_command_from_a_fit_checkpoint(sd3_dir, tmp_path):
    main(fit_args(sd3_dir, tmp_path / "run", "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint"))
    ckpt = next(Path(tmp_path / "run").rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "out"), "--merged"])
    trained = {k[len("policy.denoiser."):].replace(".default", ""): v
               for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items() if "lora_" in k}
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.load_lora_weights(tmp_path / "out")
    loaded = get_peft_model_state_dict(pipe.transformer, adapter_name="default_0")
    assert trained and sorted(loaded) == sorted(trained)
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert (tmp_path / "out/merged/model_index.json").is_file()
    # the run's version_N folder stands for its checkpoint (it once said the folder does not exist)
    assert ckpt.parent.name == "checkpoints"
    main(["export", "--ckpt", str(ckpt.parent.parent), "--out", str(tmp_path / "from_folder")])
    lora = "pytorch_lora_weights.safetensors"
    # the same tensors (the header's adapter metadata lists target modules from a set: its order may differ)
    from_folder, from_file = load_file(tmp_path / "from_folder" / lora), load_file(tmp_path / "out" / lora)
    assert from_folder.keys() == from_file.keys() and all(torch.equal(from_folder[k], from_file[k]) for k in from_file)
    with pytest.raises(SystemExit, match="flowrl export: no config.yaml beside .* pass the run's config with --config"):
        lone = tmp_path / "lone"  # two folders with no config.yaml (pytest's shared base folder is not searched)
        lone.mkdir()
        main(["export", "--ckpt", str(ckpt.rename(lone / "moved.ckpt")), "--out", str(tmp_path / "x")])


def test_sd15_lora_and_merged_exports_reproduce_the_adapters_ddim_sample(tmp_path):
    from flowrl.methods import FlowGRPO
    from flowrl.policies import SD15Policy
    from tests.policies.test_sd15 import ddim_pipeline
    from tests.policies.tiny_sd15 import save_sd15

    path = save_sd15(tmp_path / "sd15")
    policy = SD15Policy(str(path), lora=LoraOptions(rank=4, alpha=8), resolution=32).load()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    generation = FlowGRPO(policy, step_kind="ddim", noise_level=1.0, guidance_scale=3.0).generation
    ours = generation.generate(PROMPTS, SEEDS, STEPS)
    start = seeded_noise(SEEDS, policy.latent_shape(), 1)[:, 0]

    def images(pipe):  # DDIM with eta 0 from the sampler's start latents: the ODE sample
        return pipe(PROMPTS, height=32, width=32, num_inference_steps=STEPS, guidance_scale=3.0, eta=0.0,
                    latents=start, output_type="pt").images

    export_lora(policy, tmp_path / "lora")
    pipe = ddim_pipeline(str(path))
    base = images(pipe)
    pipe.load_lora_weights(tmp_path / "lora")
    assert (base - ours).abs().max() > 1e-3  # the LoRA matters
    torch.testing.assert_close(images(pipe), ours, atol=1e-5, rtol=1e-4)
    export_pipeline(policy, tmp_path / "merged")
    torch.testing.assert_close(images(ddim_pipeline(str(tmp_path / "merged"))), ours, atol=1e-5, rtol=1e-4)


def test_export_ema_writes_the_average_and_needs_one(sd3_dir, tmp_path):
    main(fit_args(sd3_dir, tmp_path / "run", "--trainer.max_steps=3",
                  "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  "--trainer.callbacks+=flowrl.callbacks.EMA", "--trainer.callbacks.decay=0.5",
                  "--trainer.callbacks.warmup=false", "--trainer.callbacks.apply_at_end=false"))
    ckpt = next(Path(tmp_path / "run").rglob("*.ckpt"))
    saved = torch.load(ckpt, weights_only=False)
    average = next(s["shadow"] for k, s in saved["callbacks"].items() if k.startswith("EMA"))
    assert any(not torch.equal(average[k], saved["state_dict"][k]) for k in average)  # the average is not the weights
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "ema"), "--ema"])
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.load_lora_weights(tmp_path / "ema")
    loaded = get_peft_model_state_dict(pipe.transformer, adapter_name="default_0")
    want = {k[len("policy.denoiser."):].replace(".default", ""): v for k, v in average.items()}
    assert sorted(loaded) == sorted(want) and all(torch.equal(loaded[k], want[k]) for k in want)
    del saved["callbacks"]
    torch.save(saved, tmp_path / "run/no_ema.ckpt")
    with pytest.raises(SystemExit, match="flowrl export: --ema needs the state of exactly one flowrl.callbacks.EMA"):
        main(["export", "--ckpt", str(tmp_path / "run/no_ema.ckpt"), "--out", str(tmp_path / "x"), "--ema"])
