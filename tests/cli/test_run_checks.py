"""The checks between the built parts of a run read the built objects (no weight loads: building reads configs):
the rewards among the trainer's callbacks against the built policy, the checkpoint against the built module and
policy. The same checks through ``fit`` are in test_config_errors.py, test_reward_policy_checks.py and
test_checkpoint_errors.py; the strategy's in test_strategy_checks.py."""

import torch

from flowrl.cli.run_checks import run_problems
from flowrl.cli.reward_checks import reward_policy_problems
from flowrl.data import PromptDataModule
from flowrl.methods import FlowGRPO
from flowrl.policies import TinyFlowPolicy
from flowrl.policies.base import LoraOptions
from flowrl.rewards import EditConsistency, JpegIncompressibility, TemporalConsistency

LORA_KEY = "policy.denoiser.transformer_blocks.0.attn.to_q.lora_A.default.weight"  # a module TinyFlowPolicy targets


def test_the_rewards_are_checked_against_the_built_policy():
    policy, data = TinyFlowPolicy(), PromptDataModule(prompts=["a cat"])
    assert reward_policy_problems([EditConsistency(), TemporalConsistency(), JpegIncompressibility()], policy,
                                  data) == [
        "trainer.callbacks: EditConsistency compares each sample with its prompt record's source image, but "
        "TinyFlowPolicy makes images from text alone; train an editing policy (flowrl.policies.FluxKontextPolicy, "
        "QwenImageEditPolicy) on prompt records with \"images\", or remove the reward",
        "trainer.callbacks: TemporalConsistency compares frames of a clip (at least 2), but TinyFlowPolicy makes "
        "single images; use it with a video policy (flowrl.policies.WanPolicy), or remove the reward"]
    policy.num_frames = 9  # what a built video policy holds: the frames are read against its clip
    assert reward_policy_problems([JpegIncompressibility(frames=[0, 12]), TemporalConsistency()], policy, data) == [
        "trainer.callbacks: JpegIncompressibility frames=[0, 12]: indices [12] are outside a clip of 9 frames "
        "(model.init_args.policy.init_args.num_frames=9); pick frames in [-9, 9), or a named selection such as "
        "first_middle_last"]


def test_the_checkpoint_is_checked_against_the_built_module(tmp_path):
    policy = TinyFlowPolicy(lora=LoraOptions(rank=4, alpha=8))
    module = FlowGRPO(policy)
    ckpt = tmp_path / "other_family.ckpt"
    torch.save({"state_dict": {LORA_KEY: torch.zeros(4, 8)}, "flowrl_method": "flowrl.methods.FlowGRPO",
                "flowrl_policy": "flowrl.policies.sd3.SD3Policy"}, ckpt)
    problem, = run_problems(module, policy, None, None, str(ckpt))
    assert problem.startswith(f"ckpt_path='{ckpt}' holds the weights of a flowrl.policies.sd3.SD3Policy policy "
                              "(recorded in the checkpoint); the config builds flowrl.policies.TinyFlowPolicy "
                              "(model.init_args.policy.class_path)"), problem
    ckpt = tmp_path / "rank_8.ckpt"
    torch.save({"state_dict": {LORA_KEY: torch.zeros(8, 8)}, "flowrl_method": "flowrl.methods.FlowGRPO",
                "flowrl_policy": "flowrl.policies.tiny.TinyFlowPolicy"}, ckpt)
    problem, = run_problems(module, policy, None, None, str(ckpt))
    assert "rank 8 in the checkpoint, 4 in model.init_args.policy.init_args.lora.rank" in problem, problem
    torch.save({"state_dict": {LORA_KEY: torch.zeros(4, 8)}, "flowrl_method": "flowrl.methods.FlowGRPO",
                "flowrl_policy": "flowrl.policies.tiny.TinyFlowPolicy"}, ckpt)
    assert run_problems(module, policy, None, None, str(ckpt)) == []  # its own: it fits
