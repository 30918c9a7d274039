"""FSDP2 on the tiny Qwen-Image pipelines (2 CPU processes, ``--trainer.strategy=fsdp2``): the per-block sharding
plan of ``QwenImageTransformer2DModel`` with true CFG, norm-rescaled guidance and masked variable-length prompts
gives the same advantages, an on-policy first update and the same LoRA weights as a 1-process run (one update), and
each rank holds half of the transformer; Qwen-Image 2.1's (``QwenImage21Transformer2DModel``, each prompt length run
unpadded) the same."""

from pathlib import Path

import torch

from tests.cli.test_fit import assert_two_ranks_equal_one
from tests.policies.test_fsdp2_pipeline import COMMON
from tests.policies.test_sd3 import fit_args, metrics
from tests.two_process_group import GROUP, module_folder

SHARDED = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


#: Qwen-Image 2.1 (no max_sequence_length; 32 px) for one update: the second batch's JPEG rewards turn the ranks'
#: float-order differences of the first update into reward differences (1e-3 measured), which the weights then follow
QWEN21 = ['--model.init_args.policy.init_args={"resolution": 32, "lora": {"rank": 4, "alpha": 8}}',
          "--trainer.max_steps=1"]


def args(model_dir, out, *extra, policy="flowrl.policies.QwenImagePolicy"):
    return fit_args(model_dir, out, *COMMON, f"--trainer.callbacks.out={out}/dump", *extra, policy=policy)


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """Qwen-Image and Qwen-Image 2.1 with LoRA on 1 process and on 2 under FSDP2 (``tests/two_process_group.py``)."""
    q21 = lambda kind, *extra: args(models["qwen_image21"], folder / "qwen21" / kind, *extra, *QWEN21,  # noqa: E731
                                    policy="flowrl.policies.QwenImage21Policy")
    # one batch: the checks read the first step and the last weights
    return ([args(models["qwen_image"], folder / "one", "--trainer.max_steps=1"), q21("one")],
            [args(models["qwen_image"], folder / "two", "--trainer.max_steps=1", *SHARDED), q21("two", *SHARDED)])


@GROUP
def test_fsdp2_qwen_image_lora_equals_one_process(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__)
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5  # on-policy with sharded weights (fp32)
    whole = torch.load(tmp_path / "one/dump/held_bytes_rank0.pt")["denoiser"]
    for rank in (0, 1):  # every block is split over the 2 ranks (its flat shards padded to even sizes)
        held = torch.load(tmp_path / f"two/dump/held_bytes_rank{rank}.pt")["denoiser"]
        assert 0.45 * whole < held < 0.55 * whole, (rank, held, whole)


@GROUP
def test_fsdp2_qwen_image21_lora_equals_one_process(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__) / "qwen21"
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5
