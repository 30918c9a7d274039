"""FSDP2 on the tiny Qwen-Image pipeline (2 CPU processes, ``--trainer.strategy=fsdp2``): the per-block sharding
plan of ``QwenImageTransformer2DModel`` with true CFG, norm-rescaled guidance and masked variable-length prompts
gives the same advantages, an on-policy first update and the same LoRA weights as a 1-process run, and each rank
holds half of the transformer."""

from pathlib import Path

import torch

from tests.cli.test_fit import assert_two_ranks_equal_one
from tests.policies.test_fsdp2_pipeline import COMMON
from tests.policies.test_sd3 import fit_args, metrics
from tests.two_process_group import GROUP, module_folder

SHARDED = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


def args(model_dir, out, *extra):
    return fit_args(model_dir, out, *COMMON, f"--trainer.callbacks.out={out}/dump", *extra,
                    policy="flowrl.policies.QwenImagePolicy")


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """Qwen-Image with LoRA on 1 process and on 2 under FSDP2 (``tests/two_process_group.py``)."""
    return [args(models["qwen_image"], folder / "one")], [args(models["qwen_image"], folder / "two", *SHARDED)]


@GROUP
def test_fsdp2_qwen_image_lora_equals_one_process(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__)
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5  # on-policy with sharded weights (fp32)
    whole = torch.load(tmp_path / "one/dump/held_bytes_rank0.pt")["denoiser"]
    for rank in (0, 1):  # every block is split over the 2 ranks (its flat shards padded to even sizes)
        held = torch.load(tmp_path / f"two/dump/held_bytes_rank{rank}.pt")["denoiser"]
        assert 0.45 * whole < held < 0.55 * whole, (rank, held, whole)
