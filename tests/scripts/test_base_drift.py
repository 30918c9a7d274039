"""scripts/base_drift.py: a policy's drift from its base model is zero for an untrained adapter and, step by step,
the exact transition KL that Flow-GRPO's own loss reports for the same trajectories."""

import importlib.util
from pathlib import Path

import pytest
import torch

from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions, TinyFlowPolicy

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "base_drift.py"
spec = importlib.util.spec_from_file_location("base_drift", SCRIPT)
base_drift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base_drift)

PROMPTS, SEEDS = ["red 1 and blue 2", "green 3 and red 4"], torch.tensor([5, 6])


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()


def test_an_untrained_adapter_has_not_drifted(policy):
    drift = base_drift.drift(policy, PROMPTS, SEEDS, guidance_scale=4.5, num_steps=3)
    assert torch.equal(drift["kl"], torch.zeros(2)) and torch.equal(drift["velocity_mse"], torch.zeros(2))


def test_the_drift_is_the_sum_of_the_losss_exact_step_kls(policy):
    """The loop's ``beta`` term (``kl_convention: exact``) of each step of the same seeds' SDE rollout, summed over
    the steps, is the path KL the script reports; the velocity MSE is positive once the adapter moved."""
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    try:
        for p in policy.trainable_parameters():  # away from the base (LoRA B = 0 is the base exactly)
            p.data.add_(0.05)
        drift = base_drift.drift(policy, PROMPTS, SEEDS, guidance_scale=1.0, num_steps=3)
        loop = FlowGRPO(policy, num_steps=3, timestep_fraction=1.0, guidance_scale=1.0, beta=0.5, noise_level=0.7,
                        kl_convention="exact")
        with torch.no_grad():
            cond = policy.encode(PROMPTS)
            rollout = loop.rollout({"prompts": PROMPTS, "group_ids": torch.zeros(2, dtype=torch.long),
                                    "seeds": SEEDS}, cond)
            ones = torch.ones_like(rollout.log_probs)
            per_row = [[loop.pair_loss(rollout, cond, ones, ones, torch.tensor([[row, k]]))[1]["kl"]
                        for k in range(3)] for row in range(2)]
    finally:
        policy.load_state_dict(state)
    assert drift["kl"].tolist() == pytest.approx([sum(steps) for steps in per_row], rel=1e-3)  # batch of 1 vs 2
    assert (drift["kl"] > 0).all() and (drift["velocity_mse"] > 0).all()
