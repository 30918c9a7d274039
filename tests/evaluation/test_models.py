"""Every kind of tuned model ``evaluate`` loads, checked against the images the model itself draws: a fully
fine-tuned checkpoint (a policy of its own), a LoRA folder with diffusers' adapter metadata (its own rank and alpha,
loaded by diffusers onto the backbone), a folder without it (``save_adapter``: the base config's LoRA options) and,
in ``test_evaluate.py``, a LoRA fit checkpoint."""

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from peft.utils import get_peft_model_state_dict
from PIL import Image

from flowrl.callbacks.image_writer import image_name
from flowrl.cli import main
from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, TinyFlowPolicy

# one xdist worker runs this file (pytest's --dist loadgroup): the session's brightness fit and evaluation
# (tests/evaluation/conftest.py) is built once, not once per worker
pytestmark = pytest.mark.xdist_group("evaluation")

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, SEEDS, STEPS = ["red 3 and blue 7", "green 1 and green 4"], [0, 5], 3


def nudged(policy, seed: int, scale: float):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(scale * torch.randn_like(p))
    return policy


def full_run(folder: Path) -> Path:
    """A fully fine-tuned run: its config (``lora: null``) and a checkpoint of perturbed denoiser weights."""
    config = yaml.safe_load((ROOT / "tests/evaluation/fit_brightness.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"]["lora"] = None
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    policy = nudged(TinyFlowPolicy(lora=None).load(), 0, 0.02)
    torch.save({"state_dict": {f"policy.{k}": v for k, v in policy.state_dict().items()}},
               folder / "checkpoints" / "last.ckpt")
    return folder / "checkpoints" / "last.ckpt"


def exported(folder: Path) -> TinyFlowPolicy:
    """A LoRA of rank 4 and alpha 16 (scale 4: loaded at the base config's alpha, it would draw other images) saved
    as ``python -m flowrl export`` saves one, with its metadata."""
    from diffusers import StableDiffusion3Pipeline

    policy = nudged(TinyFlowPolicy(lora=LoraOptions(rank=4, alpha=16)).load(), 1, 0.05)
    StableDiffusion3Pipeline.save_lora_weights(
        folder, transformer_lora_layers=get_peft_model_state_dict(policy.denoiser, adapter_name="default"),
        transformer_lora_adapter_metadata=policy.denoiser.peft_config["default"].to_dict())
    return policy


def saved(folder: Path) -> TinyFlowPolicy:
    """A LoRA saved by ``save_adapter`` (no metadata) with the default options, which the base config's null LoRA
    gives the backbone."""
    from flowrl.policies.adapter_weights import save_adapter

    policy = nudged(TinyFlowPolicy(lora=LoraOptions()).load(), 2, 0.05)
    save_adapter(policy, "default", folder)
    return policy


def test_a_full_checkpoint_and_lora_folders_draw_their_own_images(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    ckpt, source, plain = full_run(tmp_path / "full"), exported(tmp_path / "lora"), saved(tmp_path / "plain")
    suite = tmp_path / "suite.txt"
    suite.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "report"
    main(["evaluate", "--ckpt_path", f"full={ckpt}", f"lora={tmp_path / 'lora'}", f"plain={tmp_path / 'plain'}",
          "--suite", str(suite), "--seeds",
          *map(str, SEEDS), "--num_steps", str(STEPS), "--out", str(out), "--accelerator", "cpu", "--resamples",
          "200", "--grid_prompts", "1"])
    prompts, seeds = [p for p in PROMPTS for _ in SEEDS], torch.tensor(SEEDS * len(PROMPTS))
    from flowrl.checkpoints.loading import load_policy

    expected = {"base": FlowGRPO(TinyFlowPolicy(lora=None).load(), guidance_scale=4.5),
                "full": FlowGRPO(load_policy(ckpt), guidance_scale=4.5),
                "lora": FlowGRPO(source, guidance_scale=4.5), "plain": FlowGRPO(plain, guidance_scale=4.5)}
    for name, module in expected.items():
        images = (module.generation.generate(prompts, seeds, STEPS).clamp(0, 1) * 255).round().to(torch.uint8)
        files = [out / "images" / name / image_name(i // len(SEEDS), p, s)
                 for i, (p, s) in enumerate(zip(prompts, seeds.tolist()))]
        written = torch.stack([torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1) for f in files])
        assert torch.equal(written, images), name
        if name != "base":
            base = expected["base"].generation.generate(prompts, seeds, STEPS)
            # a real change, so the equality above is the model's own
            assert not torch.equal(images, base.mul(255).round().to(torch.uint8)), name
    report = (out / "report.md").read_text()
    assert "| brightness | trained | full |" in report  # its run config trained brightness
    assert "| brightness | trained | lora |" in report  # a folder: trained as the base config says


def test_a_base_that_carries_a_lora_draws_with_it(tmp_path, monkeypatch):
    # TDM-R1 starts from a distilled 4-step generator: evaluated against the teacher alone its gains would be the
    # distillation's. --base_lora makes the base the backbone with that LoRA (rank and alpha of the config: 16, 32)
    monkeypatch.chdir(ROOT)
    suite = tmp_path / "suite.txt"
    suite.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "report"
    main(["evaluate", "--config", "configs/tiny_tdm_r1.yaml", "--base_lora", "flowrl/tiny-digits-k4", "--suite",
          str(suite), "--seeds", *map(str, SEEDS), "--out", str(out), "--accelerator", "cpu", "--grid_prompts", "0"])
    prompts, seeds = [p for p in PROMPTS for _ in SEEDS], torch.tensor(SEEDS * len(PROMPTS))
    k4 = TinyFlowPolicy(lora=LoraOptions(rank=16, alpha=32, init="flowrl/tiny-digits-k4")).load()
    expected = FlowGRPO(k4, guidance_scale=1.0).generation.generate(prompts, seeds, 4)
    expected = (expected.clamp(0, 1) * 255).round().to(torch.uint8)
    files = [out / "images" / "base" / image_name(i // len(SEEDS), p, s)
             for i, (p, s) in enumerate(zip(prompts, seeds.tolist()))]
    written = torch.stack([torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1) for f in files])
    assert torch.equal(written, expected)
    with pytest.raises(SystemExit, match="--base_lora flowrl/nothing: embedded model 'flowrl/nothing' is not shipped"):
        main(["evaluate", "--config", "configs/tiny_tdm_r1.yaml", "--base_lora", "flowrl/nothing"])


def test_a_lora_folder_of_another_family_is_named_before_any_weight_loads(tmp_path, monkeypatch):
    from diffusers import StableDiffusion3Pipeline

    monkeypatch.chdir(ROOT)
    policy = TinyFlowPolicy(lora=LoraOptions(rank=4, alpha=16)).load()
    # another family's names for the same layers (Wan's attention is attn1): none is a module of the tiny denoiser
    layers = {k.replace(".attn.", ".attn1."): v
              for k, v in get_peft_model_state_dict(policy.denoiser, adapter_name="default").items()}
    metadata = policy.denoiser.peft_config["default"].to_dict()
    metadata["target_modules"] = sorted(t.replace("attn.", "attn1.") for t in metadata["target_modules"])
    StableDiffusion3Pipeline.save_lora_weights(tmp_path / "other", transformer_lora_layers=layers,
                                               transformer_lora_adapter_metadata=metadata)
    suite = tmp_path / "suite.txt"
    suite.write_text(PROMPTS[0] + "\n")
    from diffusers import ModelMixin
    from transformers import PreTrainedModel

    def refused(*args, **kwargs):
        raise AssertionError("a weight loaded before the LoRA folder was checked")

    for model_class in (ModelMixin, PreTrainedModel):  # the check reads configs and the folder's keys, no weights
        monkeypatch.setattr(model_class, "from_pretrained", classmethod(refused))
    with pytest.raises(SystemExit) as err:  # was peft's bare NoMatchingPeftModuleError
        main(["evaluate", "--config", "configs/quickstart.yaml", "--ckpt_path", f"other={tmp_path / 'other'}",
              "--suite", str(suite), "--seeds", "0",
              "--num_steps", "2", "--out", str(tmp_path / "report"), "--accelerator", "cpu"])
    message = str(err.value)
    assert message.startswith(f"flowrl evaluate: the LoRA folder {tmp_path / 'other'} adapts modules the base "
                              "model's denoiser has not (e.g. transformer_blocks.0.attn1."), message
    assert "the base is flowrl.policies.TinyFlowPolicy on " in message and "a LoRA of another model family" in message


def with_average(folder: Path, lora: bool) -> tuple[Path, TinyFlowPolicy, TinyFlowPolicy]:
    """A run's checkpoint whose trained weights and EMA average (in the callback state, as ``flowrl.callbacks.EMA``
    keeps it) are two different perturbations of the base: the checkpoint, the trained policy, the averaged one."""
    config = yaml.safe_load((ROOT / "tests/evaluation/fit_brightness.yaml").read_text())
    if not lora:
        config["model"]["init_args"]["policy"]["init_args"]["lora"] = None
    options = LoraOptions(rank=8, alpha=16) if lora else None
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    trained, average = (nudged(TinyFlowPolicy(lora=options).load(), seed, 0.05) for seed in (3, 4))
    shadow = {f"policy.{n}": p.detach().float() for n, p in average.named_parameters() if p.requires_grad}
    torch.save({"state_dict": {f"policy.{k}": v for k, v in trained.state_dict().items()},
                "callbacks": {"EMA{'decay': 0.9, 'every_n_steps': 2}": {"shadow": shadow, "num_updates": 1,
                                                                       "last_step": 2}}},
               folder / "checkpoints" / "last.ckpt")
    return folder / "checkpoints" / "last.ckpt", trained, average


def test_ema_evaluates_each_checkpoints_average(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    (full, _, full_avg), (lora, lora_trained, lora_avg) = (with_average(tmp_path / name, name == "lora")
                                                           for name in ("full", "lora"))
    suite = tmp_path / "suite.txt"
    suite.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "report"
    main(["evaluate", "--ckpt_path", f"full={full}", f"lora={lora}", "--ema", "--suite", str(suite), "--seeds",
          *map(str, SEEDS), "--num_steps", str(STEPS), "--out", str(out), "--accelerator", "cpu", "--resamples",
          "200", "--grid_prompts", "1", "--config", str(ROOT / "tests/evaluation/fit_brightness.yaml")])
    prompts, seeds = [p for p in PROMPTS for _ in SEEDS], torch.tensor(SEEDS * len(PROMPTS))
    for name, policy in {"full": full_avg, "lora": lora_avg, "trained": lora_trained}.items():
        images = FlowGRPO(policy, guidance_scale=4.5).generation.generate(prompts, seeds, STEPS)
        images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
        files = [out / "images" / (name if name != "trained" else "lora") / image_name(i // len(SEEDS), p, s)
                 for i, (p, s) in enumerate(zip(prompts, seeds.tolist()))]
        written = torch.stack([torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1) for f in files])
        assert torch.equal(written, images) == (name != "trained"), name  # the average, not the trained weights


def test_ema_without_an_average_or_on_a_lora_folder_is_named_before_any_weight_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    ckpt = full_run(tmp_path / "full")  # no EMA state
    exported(tmp_path / "lora")
    monkeypatch.setattr(TinyFlowPolicy, "load", lambda self: pytest.fail("a weight loaded before the check"))
    with pytest.raises(SystemExit) as err:
        main(["evaluate", "--ckpt_path", f"full={ckpt}", f"lora={tmp_path / 'lora'}", "--ema", "--suite",
              str(ROOT / "configs/prompts/digits_val.txt")])
    message = str(err.value)
    assert f"--ema: full={ckpt}: --ema needs the state of exactly one flowrl.callbacks.EMA" in message
    assert f"--ema: lora={tmp_path / 'lora'} is a LoRA folder" in message
