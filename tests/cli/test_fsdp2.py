"""FSDP2 (``--trainer.strategy=fsdp2``) on 2 CPU processes through ``python -m flowrl fit``: a 1-process checkpoint
resumed under FSDP2, the dense-reward methods' ODE completions on sharded weights, and 2 "nodes" x 1 process on
localhost. Each 2-process run is a real subprocess with a timeout (the resume's fit runs in the suite's one process
group of them: tests/two_process_group.py). An exact resume from a sharded checkpoint, the EMA's shards included:
tests/methods/test_likelihood_free_fsdp2.py. The same advantages, gradient norms and weights as a 1-process run for
every method (LoRA, and full fine-tuning with a sharded KL reference and clipping), each rank holding a shard of the
denoiser: tests/methods/test_two_ranks_equal_one.py."""

from pathlib import Path

import pytest
import torch

from tests.cli.test_ddp_configs import finish, fit, one_process, summary, two_nodes
from tests.cli.test_fit import fit_args, load_steps
from tests.methods.likelihood_free import CHECKPOINTS
from tests.two_process_group import GROUP, module_folder

FSDP2 = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


ONE_PROCESS = "one_process_checkpoint"  # the folder of a 1-process checkpoint resumed under FSDP2


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """A 1-process run of 4 steps checkpointed every 2, and its step 2 resumed under FSDP2
    (``tests/two_process_group.py``). A sharded checkpoint's exact resume, the EMA's shards included:
    ``tests/methods/test_likelihood_free_fsdp2.py``."""
    one = folder / ONE_PROCESS
    return ([fit_args(models["tiny"], one / "straight", "--trainer.max_steps=4", *CHECKPOINTS,
                      f"--trainer.callbacks.dirpath={one}/straight/ckpt")],
            [fit_args(models["tiny"], one / "resumed", "--trainer.max_steps=4",
                      f"--ckpt_path={one}/straight/ckpt/epoch=0-step=2.ckpt", *FSDP2)])


# slow: every method's FSDP2 fit equals its 1-process fit in the default suite (ODE completions on the sharded
# denoiser and each tree depth's batched forward included): tests/methods/test_two_ranks_equal_one.py
@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny_dense_grpo.yaml", "tiny_branch_grpo.yaml", "tiny_tp_grpo.yaml",
                                    "tiny_tempflow_grpo.yaml", "tiny_tree_rpo.yaml"])
def test_fsdp2_dense_methods_print_the_numbers_of_one_process(config, tmp_path, capsys, monkeypatch):
    # their rollouts complete states with the ODE on the sharded denoiser (all-gathered per block); the tree methods
    # also run each depth's nodes as one batched forward of it
    one = one_process(config, tmp_path / "one", capsys, monkeypatch)
    assert summary(fit(config, tmp_path / "two", *FSDP2)) == one


# slow: the launch as 2 nodes is covered by tests/cli/test_ddp_configs.py (DDP), FSDP2 on 2 ranks by the suite's
# process group of 2-process fits (tests/two_process_group.py)
@pytest.mark.slow
def test_fsdp2_on_two_nodes_of_one_process_equals_one_process(tmp_path, capsys, monkeypatch):
    # Lightning's cluster variables on localhost, as a SLURM or torchrun launch sets them: one data-parallel rank per
    # process over both nodes
    config = "tiny_flow_grpo.yaml"
    one = one_process(config, tmp_path / "one", capsys, monkeypatch)
    nodes = two_nodes(config, tmp_path / "nodes", "fsdp2")
    assert summary(nodes[0]) == one
    finish(nodes[1])


@GROUP
def test_a_one_process_checkpoint_resumes_under_fsdp2(two_process_fits):
    # its optimizer states are keyed by position in the optimizer (the trained LoRA weights only), which Lightning's
    # FSDP2 loader read as positions among every weight of the module: "Missing optimizer state for parameter ..."
    tmp_path = module_folder(two_process_fits, __name__) / ONE_PROCESS
    assert (tmp_path / "straight/ckpt/epoch=0-step=2.ckpt").is_file()  # one file, from one process
    straight, resumed = load_steps(tmp_path / "straight"), load_steps(tmp_path / "resumed")
    for step in ("step2", "step3"):  # the weights and Adam's moments carried over: the 1-process run's advantages
        ranks = [resumed[f"{step}_rank{r}"] for r in (0, 1)]
        seeds = torch.cat([r["seeds"] for r in ranks])
        one = straight[f"{step}_rank0"]
        assert torch.equal(seeds.sort().values, one["seeds"].sort().values)
        torch.testing.assert_close(torch.cat([r["advantages"] for r in ranks])[seeds.argsort()],
                                   one["advantages"][one["seeds"].argsort()], rtol=1e-4, atol=1e-5)
    w1, w2 = torch.load(tmp_path / "straight/dump/weights.pt"), torch.load(tmp_path / "resumed/dump/weights.pt")
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-6) for k in w1)
