"""Two-step CLI fits of Flow-GRPO on the tiny Qwen-Image, Qwen-Image 2.1, FLUX.2 [klein] and Z-Image pipelines: with
LoRA and recomputed log-probs the first minibatch is exactly on-policy (ratio 1), and ``python -m flowrl export`` of
the checkpoint gives LoRA weights the plain pipeline's ``load_lora_weights`` loads unchanged; full fine-tuning (Z-Image)
is on-policy within float32 rounding and exports the whole pipeline."""


import numpy as np
import pytest
import torch
from diffusers import Flux2KleinPipeline, QwenImage21Pipeline, QwenImagePipeline, ZImagePipeline
from peft.utils import get_peft_model_state_dict

from flowrl.cli import main
from tests.policies.test_sd3 import HERE, fit_args, metrics

FAMILIES = {"qwen_image": ("flowrl.policies.QwenImagePolicy", QwenImagePipeline),
            "qwen_image21": ("flowrl.policies.QwenImage21Policy", QwenImage21Pipeline),
            "flux2": ("flowrl.policies.Flux2Policy", Flux2KleinPipeline),
            "zimage": ("flowrl.policies.ZImagePolicy", ZImagePipeline)}
CHECKPOINT = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint"]


@pytest.fixture
def model_dir(request, qwen_image_dir, qwen_image21_dir, flux2_dir, zimage_dir):
    return {"qwen_image": qwen_image_dir, "qwen_image21": qwen_image21_dir, "flux2": flux2_dir,
            "zimage": zimage_dir}[request.param]


@pytest.mark.parametrize("family,model_dir", [(f, f) for f in FAMILIES], indirect=["model_dir"])
def test_lora_fit_is_on_policy_and_its_export_loads_into_the_pipeline(family, model_dir, tmp_path):
    policy, pipeline_class = FAMILIES[family]
    # sampling runs the 4 trajectories as one CFG batch of 8 rows, the update one pair per micro-batch
    main(fit_args(model_dir, tmp_path / "run", "--trainer.max_steps=2", "--model.init_args.recompute_log_probs=true",
                  "--model.init_args.micro_batch_size=1", *CHECKPOINT, policy=policy))
    logged = metrics(tmp_path / "run")
    assert logged["train/check_ratio_max_dev"] == 0.0 and logged["train/ratio_max_dev"] == 0.0
    assert np.isfinite(logged["train/loss"]) and logged["step"] == 1  # the second optimizer step logged
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "lora")])
    trained = {k[len("policy.denoiser."):].replace(".default", ""): v
               for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items() if "lora_" in k}
    pipe = pipeline_class.from_pretrained(model_dir)
    pipe.load_lora_weights(tmp_path / "lora")
    loaded = get_peft_model_state_dict(pipe.transformer, adapter_name="default_0")
    assert trained and sorted(loaded) == sorted(trained)
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert any(v.abs().sum() > 0 for k, v in trained.items() if "lora_B" in k)  # B starts at 0: it trained


def test_full_finetuning_fit_is_on_policy_and_exports_the_pipeline(zimage_dir, tmp_path):
    main(fit_args(zimage_dir, tmp_path / "run", "--config", str(HERE / "full_finetune.yaml"), "--trainer.max_steps=2",
                  *CHECKPOINT, policy="flowrl.policies.ZImagePolicy"))
    logged = metrics(tmp_path / "run")
    assert logged["train/check_ratio_max_dev"] < 1e-5 and np.isfinite(logged["train/loss"])
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "full")])
    trained = {k[len("policy.denoiser."):]: v for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items()
               if k.startswith("policy.denoiser.")}
    loaded = ZImagePipeline.from_pretrained(tmp_path / "full").transformer.state_dict()
    base = ZImagePipeline.from_pretrained(zimage_dir).transformer.state_dict()
    assert len(trained) > 20 and all(torch.equal(loaded[k], v) for k, v in trained.items())
    assert any(not torch.equal(loaded[k], base[k]) for k in trained)  # trained, not the model it started from
