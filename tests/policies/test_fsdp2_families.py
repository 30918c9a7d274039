"""FSDP2 on the tiny Qwen-Image pipeline (2 CPU processes, ``--trainer.strategy=fsdp2``): the per-block sharding
plan of ``QwenImageTransformer2DModel`` with true CFG, norm-rescaled guidance and masked variable-length prompts
gives the same advantages, an on-policy first update and the same LoRA weights as a 1-process run, and each rank
holds half of the transformer."""

import torch

from flowrl.cli import main
from tests.cli.test_fit import assert_two_ranks_equal_one, run_cli
from tests.policies.test_fsdp2_pipeline import COMMON
from tests.policies.test_sd3 import fit_args, metrics

SHARDED = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


def args(model_dir, out, *extra):
    return fit_args(model_dir, out, *COMMON, f"--trainer.callbacks.out={out}/dump", *extra,
                    policy="flowrl.policies.QwenImagePolicy")


def test_fsdp2_qwen_image_lora_equals_one_process(qwen_image_dir, tmp_path):
    main(args(qwen_image_dir, tmp_path / "one"))  # in this process: only the 2-process run needs its own
    run_cli(args(qwen_image_dir, tmp_path / "two", *SHARDED), tmp_path)
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5  # on-policy with sharded weights (fp32)
    whole = torch.load(tmp_path / "one/dump/held_bytes_rank0.pt")["denoiser"]
    for rank in (0, 1):  # every block is split over the 2 ranks (its flat shards padded to even sizes)
        held = torch.load(tmp_path / f"two/dump/held_bytes_rank{rank}.pt")["denoiser"]
        assert 0.45 * whole < held < 0.55 * whole, (rank, held, whole)
