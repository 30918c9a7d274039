"""HunyuanVideo 1.5 beyond the fidelity cases (``test_fidelity.py``) and the method matrix (``test_every_method.py``):
the glyph encoder's input by hand, what is refused before any weight loads, LoRA and merged exports that the plain
pipeline loads and reproduces, and the two shipped configs on the tiny pipeline (Flow-GRPO through the checks as
shipped; TempFlow-GRPO with the learned VideoReward fitting one batch)."""

import json
import shutil

import pytest
import torch
import yaml
from diffusers import HunyuanVideo15Pipeline

from flowrl.cli import main
from flowrl.methods import FlowGRPO
from flowrl.policies import HunyuanVideo15I2VPolicy, HunyuanVideo15Policy, LoraOptions
from flowrl.policies.export import export_lora, export_pipeline
from flowrl.policies.pipeline_policy import PolicyOptionsError
from tests.cli.no_weights import Built, stop_when_built
from tests.policies.pipeline_oracle import start_noise
from tests.policies.test_wan_fit import ROOT, logged, samples_per_rollout
from tests.policies.tiny_hunyuan15 import SHORT_TEXT, short_text

SIZE = dict(height=12, width=16, num_frames=5)
PROMPTS, SEEDS, STEPS, GUIDANCE = ["a red cat", "a blue dog"], torch.tensor([3, 4]), 2, 4.0


def policy(path, **kw):
    return HunyuanVideo15Policy(path, lora=LoraOptions(rank=4, alpha=8), **{**SIZE, **SHORT_TEXT, **kw}).load()


def test_the_glyph_encoder_reads_the_quoted_text_only(hunyuan15_dirs):
    """``extract_glyph_texts('a sign "hi" and “ok”')`` is ``'Text "hi". Text "ok". '``: 22 bytes + ``</s>`` = 23
    real ByT5 tokens of 256; a prompt without quotes has no glyph tokens (zeros, mask 0), as the pipeline."""
    hy = policy(hunyuan15_dirs["hunyuan15_t2v"])
    cond = hy.encode(['a sign "hi" and \u201cok\u201d', "a dog"])
    assert cond.extra["glyph_mask"].sum(1).tolist() == [23.0, 0.0]
    assert cond.extra["glyph_embeds"][1].abs().max() == 0
    theirs, mask = HunyuanVideo15Pipeline._get_byt5_prompt_embeds(
        hy.tokenizer_2, hy.text_encoder_2, ['a sign "hi" and \u201cok\u201d'], "cpu",
        tokenizer_max_length=SHORT_TEXT["glyph_max_sequence_length"])
    torch.testing.assert_close(cond.extra["glyph_embeds"][:1], theirs, rtol=0, atol=0)
    # the policy's lengths (the pipeline's 1000 and 256 by default)
    assert cond.extra["mask"].shape == (2, 32) and cond.embeds.shape[1] == 32 and mask.shape == (1, 32)


def edited(src: str, out, component: str, **changes) -> str:
    """A copy of the folder ``src`` with ``changes`` written into ``component``'s config."""
    shutil.copytree(src, out)
    name = "guider_config.json" if component == "guider" else "config.json"
    path = out / component / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return str(out)


def test_what_the_policies_cannot_run_is_refused_before_loading(hunyuan15_dirs, tmp_path, refuse_weights):
    t2v, i2v = hunyuan15_dirs["hunyuan15_t2v"], hunyuan15_dirs["hunyuan15_i2v"]
    meanflow = edited(i2v, tmp_path / "meanflow", "transformer", use_meanflow=True)
    with pytest.raises(PolicyOptionsError) as err:
        HunyuanVideo15I2VPolicy(meanflow, height=12, width=24, num_frames=6)
    assert len(err.value.problems) == 3, err.value.problems
    assert "step-distilled (MeanFlow)" in str(err.value) and "1 + a multiple of 2" in str(err.value)
    # 12 x 24: not among the size buckets of target_size 16
    assert "policy.width=24 at policy.height=12 is not a size the pipeline generates at" in str(err.value)
    rescaled = edited(t2v, tmp_path / "rescaled", "guider", guidance_rescale=0.7)
    with pytest.raises(PolicyOptionsError, match="guidance_rescale=0.7"):
        HunyuanVideo15Policy(rescaled, **SIZE)
    # a CFG-distilled folder (its guider at 1.0) samples with one evaluation, as its pipeline
    distilled = HunyuanVideo15Policy(edited(t2v, tmp_path / "distilled", "guider", guidance_scale=1.0), **SIZE)
    assert (distilled.guidance_kind, HunyuanVideo15Policy(t2v, **SIZE).guidance_kind) == ("none", "cfg")


def test_lora_and_merged_exports_load_into_the_plain_pipeline_and_reproduce_the_video(hunyuan15_dirs, tmp_path):
    path = hunyuan15_dirs["hunyuan15_t2v"]
    hy = policy(path)
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move every trained weight
        for p in hy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = FlowGRPO(hy, guidance_scale=GUIDANCE).generation.final_latents(hy.encode(PROMPTS), SEEDS, STEPS)

    def pipe_latents(pipe):
        pipe.guider = pipe.guider.new(guidance_scale=GUIDANCE)
        short_text(pipe).set_progress_bar_config(disable=True)
        return pipe(prompt=PROMPTS, negative_prompt=[""] * 2, latents=start_noise(hy, SEEDS),
                    num_inference_steps=STEPS, output_type="latent", **SIZE).frames

    export_lora(hy, tmp_path / "lora")
    base = pipe_latents(HunyuanVideo15Pipeline.from_pretrained(path))
    assert (base - ours).abs().max() > 1e-3  # the LoRA matters, so the match below is the LoRA's
    pipe = HunyuanVideo15Pipeline.from_pretrained(path)
    pipe.transformer.load_lora_adapter(str(tmp_path / "lora"), weight_name="pytorch_lora_weights.safetensors",
                                       prefix="transformer")
    torch.testing.assert_close(pipe_latents(pipe), ours, atol=1e-5, rtol=1e-4)
    export_pipeline(hy, tmp_path / "merged")
    torch.testing.assert_close(pipe_latents(HunyuanVideo15Pipeline.from_pretrained(tmp_path / "merged")), ours,
                               atol=1e-5, rtol=1e-4)


def test_the_flow_grpo_config_passes_the_checks_before_loading_as_shipped(hunyuan15_dirs, tmp_path, monkeypatch):
    stop_when_built(monkeypatch, {})
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    with pytest.raises(Built):  # a SystemExit here is a problem the checks found: its text names it
        main(["fit", "--config", str(ROOT / "configs/hunyuan_video15_flow_grpo.yaml"),
              "--data.prompts=[a red cat, a blue dog]", f"--trainer.default_root_dir={tmp_path}",
              f"--model.init_args.policy.init_args.model={hunyuan15_dirs['hunyuan15_t2v']}",
              "--model.init_args.policy.init_args.height=12", "--model.init_args.policy.init_args.width=16",
              "--model.init_args.policy.init_args.num_frames=5"])


def test_the_videoreward_tempflow_config_fits_one_batch(hunyuan15_dirs, tmp_path):
    """``configs/hunyuan_video15_videoreward_tempflow_grpo.yaml`` with its method options shrunk (2 steps, trees of 2
    branches) on the tiny pipeline and a tiny VideoReward judge (its three dimensions, as shipped): every dimension
    scores each leaf, the update recomputes the sampled log-probs (ratio 1) and the LoRA moves."""
    from flowrl.rewards.shared_judge import _JUDGES
    from tests.rewards.test_video_judges import TINY
    from tests.rewards.tiny_video_judges import qwen2_vl_base, videoalign_folder

    config = "hunyuan_video15_videoreward_tempflow_grpo"
    judge = videoalign_folder(tmp_path / "videoreward", qwen2_vl_base(tmp_path / "qwen2_vl"))
    shipped = yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())["trainer"]["callbacks"]
    judged = [c for c in shipped if c["class_path"] == "flowrl.rewards.VideoReward"]
    assert [c["init_args"]["dimension"] for c in judged] == ["VQ", "MQ", "TA"]
    method = {"num_steps": 2, "eval_num_steps": 2, "branches": 2, "tree_chunk_size": None, "micro_batch_size": 4,
              "num_minibatches": 1, "check_ratio": True, "check_ratio_threshold": 1.0e-5}
    layer = {"trainer": {"accelerator": "cpu", "devices": 1, "strategy": "auto", "max_steps": 1,
                         "limit_val_batches": 0, "enable_progress_bar": False, "default_root_dir": str(tmp_path),
                         "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                    "init_args": {"save_dir": str(tmp_path), "name": "csv"}},
                         "callbacks": [{"class_path": c["class_path"], "init_args": {
                             **c["init_args"], "model": str(judge), **TINY}} for c in judged] + [
                             {"class_path": "tests.cli.dump_outputs.DumpOutputs",
                              "init_args": {"out": str(tmp_path)}}]},
             "model": {"init_args": {"policy": {"init_args": {
                 "model": hunyuan15_dirs["hunyuan15_t2v"], **SIZE, **SHORT_TEXT, "torch_dtype": "float32",
                 "autocast": None,                 "vae_tiling": False, "lora": {"rank": 4, "alpha": 8}}}, **method}},
             "data": {"prompts": PROMPTS[:1], "num_groups": 1, "group_size": samples_per_rollout(config, method)}}
    overlay = tmp_path / "tiny.yaml"
    overlay.write_text(yaml.safe_dump(layer))
    try:
        main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--config", str(overlay)])
    finally:
        _JUDGES.clear()
    metrics = logged(tmp_path)
    assert metrics["train/check_ratio_max_dev"] < 1e-5
    assert all(torch.isfinite(torch.tensor(metrics[f"train/reward/videoreward_{d}"])) for d in ("vq", "mq", "ta"))
    assert any(v.any() for k, v in torch.load(tmp_path / "weights.pt").items() if "lora_B" in k)
