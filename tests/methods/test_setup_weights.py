"""A method builds on an unloaded policy; ``configure_model`` loads it and runs the method's ``setup_weights`` once,
drawing the random initialisation that building with a loaded policy drew."""

import torch
from lightning.pytorch import Trainer

from flowrl.methods import TDMR1, DiffusionNFT
from flowrl.policies import TinyFlowPolicy
from flowrl.policies.base import LoraOptions

LORA = LoraOptions(rank=4, alpha=8)


def attached(method):
    method.trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
    return method


def test_configure_model_loads_then_runs_the_hook_once(tiny_model_dir, monkeypatch):
    method = attached(DiffusionNFT(TinyFlowPolicy(tiny_model_dir, lora=LORA), num_steps=3))
    assert not method.policy.loaded and method.policy.adapter_names == []  # building loaded nothing
    calls = []
    original = DiffusionNFT.setup_weights
    monkeypatch.setattr(DiffusionNFT, "setup_weights", lambda self: (calls.append(self.policy.loaded),
                                                                     original(self)))
    method.configure_model()
    method.configure_model()  # Lightning calls it again for validate / test / predict
    assert calls == [True]  # once, after the policy's weights loaded
    assert method.policy.adapter_names == ["default", "old"]


def test_the_hook_draws_what_building_on_a_loaded_policy_drew(tiny_model_dir):
    torch.manual_seed(0)
    before = TDMR1(TinyFlowPolicy(tiny_model_dir, lora=LORA).load()).load_weights()  # as when __init__ loaded
    torch.manual_seed(0)
    now = attached(TDMR1(TinyFlowPolicy(tiny_model_dir, lora=LORA)))
    torch.randn(100)  # what runs between building and configure_model (data, rewards)
    now.configure_model()
    assert now.policy.adapter_names == before.policy.adapter_names
    theirs = dict(before.policy.named_parameters())
    assert all(torch.equal(p, theirs[name]) for name, p in now.policy.named_parameters())
