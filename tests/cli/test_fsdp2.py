"""FSDP2 (``--trainer.strategy=fsdp2``) on 2 CPU processes through ``python -m flowrl fit``: an exact resume from a sharded checkpoint with EMA, the dense-reward
methods' ODE completions on sharded weights, and 2 "nodes" x 1 process on localhost. Each 2-process run is a real
subprocess with a timeout (the resumes' fits run in the suite's one process group of them:
tests/two_process_group.py). The same advantages, gradient norms and weights as a 1-process run for every method
(LoRA, and full fine-tuning with a sharded KL reference and clipping), each rank holding a shard of the denoiser:
tests/methods/test_two_ranks_equal_one.py."""

from pathlib import Path

import pytest
import torch

from flowrl.checkpoints.sharded import load_consolidated
from tests.cli.test_ddp_configs import finish, fit, one_process, summary, two_nodes
from tests.cli.test_fit import fit_args, load_steps
from tests.methods.likelihood_free import CHECKPOINTS
from tests.two_process_group import GROUP, module_folder

FSDP2 = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


RESUME = "resume"  # the folder of the sharded resume's fits
# the uninterrupted run's checkpoint at step 2, the one a run stopped there would have written (2 batches an epoch:
# step 2 ends epoch 0)
SAVED = f"{RESUME}/straight/ckpt/epoch=0-step=2.ckpt"
ONE_PROCESS = "one_process_checkpoint"  # the folder of a 1-process checkpoint resumed under FSDP2


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """The sharded resume's two fits (straight, checkpointed every 2 steps, and resumed from its step 2); a 1-process
    run of 4 steps checkpointed every 2, and its step 2 resumed under FSDP2 (``tests/two_process_group.py``)."""
    extra = [*FSDP2, "--trainer.callbacks+=flowrl.callbacks.EMA", "--trainer.callbacks.apply_at_end=false",
             *CHECKPOINTS,
             # validation swaps the EMA shards in and out on every rank (one validation prompt per rank)
             "--data.val_prompts=[red 1 and blue 2, green 3 and red 4]", "--trainer.limit_val_batches=1.0"]
    resume = lambda out, *more: fit_args(models["tiny"], folder / RESUME / out, *extra,  # noqa: E731
                                         f"--trainer.callbacks.dirpath={folder / RESUME / out}/ckpt", *more)
    one = folder / ONE_PROCESS
    return ([fit_args(models["tiny"], one / "straight", "--trainer.max_steps=4", *CHECKPOINTS,
                      f"--trainer.callbacks.dirpath={one}/straight/ckpt")],
            [resume("straight", "--trainer.max_steps=4"),
             resume("resumed", "--trainer.max_steps=4", f"--ckpt_path={folder / SAVED}"),
             fit_args(models["tiny"], one / "resumed", "--trainer.max_steps=4",
                      f"--ckpt_path={one}/straight/ckpt/epoch=0-step=2.ckpt", *FSDP2)])


@GROUP
def test_fsdp2_resume_from_a_sharded_checkpoint_equals_an_uninterrupted_run(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__) / RESUME
    saved = tmp_path.parent / SAVED
    assert saved.is_dir() and len(list(saved.glob("*.distcp"))) == 2  # one shard file per rank
    straight, resumed = load_steps(tmp_path / "straight"), load_steps(tmp_path / "resumed")
    assert sorted(resumed) == ["step2_rank0", "step2_rank1", "step3_rank0", "step3_rank1"]
    for key in resumed:  # the sampler's position and the weights carried over: the same rollouts and advantages
        assert torch.equal(straight[key]["seeds"], resumed[key]["seeds"])
        assert torch.equal(straight[key]["advantages"], resumed[key]["advantages"])
    a, b = (load_consolidated(next(Path(tmp_path / run).rglob("*step=4.ckpt"))) for run in ("straight", "resumed"))
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    for k, state in a["optimizer_0"]["state"].items():  # AdamW's moments, gathered from both ranks' shards
        assert all(torch.equal(v, b["optimizer_0"]["state"][k][name]) for name, v in state.items())
    ema_a, ema_b = ([s for key, s in c["callbacks"].items() if key.startswith("EMA")][0] for c in (a, b))
    assert ema_a["num_updates"] == ema_b["num_updates"] == 4  # resumed, not restarted from the restored weights
    assert all(torch.equal(ema_a["shadow"][k], ema_b["shadow"][k]) for k in ema_a["shadow"])
    assert any(not torch.equal(ema_a["shadow"][k], a["state_dict"][k]) for k in ema_a["shadow"])


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
