"""One adapter's LoRA weights to and from the diffusers layout and the TDM-R1 code's EMA list, with the mismatches
refused: the start of TDM-R1's generator (``generator_init``)."""

import pytest
import torch
from safetensors.torch import load_file

from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.policies.adapter_weights import load_adapter, save_adapter


def moved(policy, name, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters(name):
            p.add_(torch.randn_like(p))


def test_save_then_load_into_another_adapter_and_policy(tiny_model_dir, tmp_path):
    source = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    moved(source, "default", 1)
    file = save_adapter(source, "default", tmp_path / "lora")
    keys = list(load_file(file))
    assert keys and all(k.startswith("transformer.") and ".default." not in k for k in keys)  # the diffusers layout
    target = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    target.add_adapter("generator", LoraOptions(rank=4, alpha=8))
    load_adapter(target, "generator", str(tmp_path / "lora"))  # the folder: its pytorch_lora_weights.safetensors
    assert all(torch.equal(a, b) for a, b in zip(source.trainable_parameters("default"),
                                                 target.trainable_parameters("generator")))
    assert all(p.abs().sum() == 0 for n, p in target.named_parameters() if "lora_B.default." in n)  # untouched


def test_the_tdm_r1_ema_list_loads_in_module_order(tiny_model_dir, tmp_path):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    params = policy.trainable_parameters("default")
    tensors = [torch.full_like(p, float(i)) for i, p in enumerate(params)]
    torch.save({"decay": 0.9, "ema_parameters": tensors}, tmp_path / "tdm.ckpt")
    load_adapter(policy, "default", str(tmp_path / "tdm.ckpt"))
    assert all(torch.equal(p, t) for p, t in zip(params, tensors))
    torch.save({"ema_parameters": tensors[:-1]}, tmp_path / "short.ckpt")
    with pytest.raises(ValueError, match=f"holds {len(params) - 1} tensors"):
        load_adapter(policy, "default", str(tmp_path / "short.ckpt"))


def test_mismatched_weights_and_missing_files_fail_clearly(tiny_model_dir, tmp_path):
    rank8 = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=8, alpha=8)).load()
    save_adapter(rank8, "default", tmp_path / "r8")
    rank4 = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    with pytest.raises(ValueError, match="do not fit adapter 'default'"):
        load_adapter(rank4, "default", str(tmp_path / "r8"))
    with pytest.raises(FileNotFoundError, match="no LoRA weights"):
        load_adapter(rank4, "default", str(tmp_path))
    with pytest.raises(ValueError, match="no adapter 'nope'"):
        load_adapter(rank4, "nope", str(tmp_path / "r8"))
