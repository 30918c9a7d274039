"""The sharded strategies on 2 CUDA GPUs: FSDP2 and DeepSpeed ZeRO-2/3 train the groups, advantages and weights of a
1-GPU run (SGD at lr 1, as the CPU tests, so a missing or partial gradient reduction shows). Marked ``gpu``: skipped
without 2 GPUs (and without the ``deepspeed`` extra for DeepSpeed). Not yet run: this project's CI machines have no GPU.
"""

import importlib.util

import pytest
import torch

from tests.cli.test_fit import fit_args, load_steps, run_cli

pytestmark = pytest.mark.gpu
COMMON = ["--trainer.accelerator=gpu", "--model.init_args.micro_batch_size=3",
          "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.lr=1.0",
          "--model.init_args.max_grad_norm=null", "--model.init_args.num_minibatches=2", "--trainer.max_steps=4"]
STRATEGIES = ["fsdp2", "deepspeed_stage_2", "deepspeed_stage_3"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_gpus_equal_one_gpu(strategy, tiny_model_dir, tmp_path):
    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs pip install 'flowrl[deepspeed]'")
    run_cli(fit_args(tiny_model_dir, tmp_path / "one", *COMMON, "--trainer.devices=1"), tmp_path)
    run_cli(fit_args(tiny_model_dir, tmp_path / "two", *COMMON, "--trainer.devices=2",
                     f"--trainer.strategy={strategy}"), tmp_path)
    one, two = load_steps(tmp_path / "one"), load_steps(tmp_path / "two")
    # every batch after the first samples with the updated weights: its advantages check every earlier update
    for step in sorted({k.split("_")[0] for k in one}):
        ranks = [two[f"{step}_rank{r}"] for r in (0, 1)]
        seeds = torch.cat([r["seeds"] for r in ranks])
        torch.testing.assert_close(torch.cat([r["advantages"] for r in ranks])[seeds.argsort()],
                                   one[f"{step}_rank0"]["advantages"][one[f"{step}_rank0"]["seeds"].argsort()],
                                   atol=1e-4, rtol=1e-3)  # TF32 and reduction order on GPUs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scored_images_leave_the_gpu_before_the_update(tiny_model_dir, tmp_path):
    run_cli(fit_args(tiny_model_dir, tmp_path, *COMMON, "--trainer.devices=1", "--trainer.max_steps=2"), tmp_path)
    step = load_steps(tmp_path)["step0_rank0"]
    assert step["devices"] == {"images": "cpu", "module": "cuda"}
