"""FSDP2 (``--trainer.strategy=fsdp2``) on 2 CPU processes through ``python -m flowrl fit``: an exact resume from a sharded checkpoint with EMA, the dense-reward
methods' ODE completions on sharded weights, and 2 "nodes" x 1 process on localhost. Each 2-process run is a real
subprocess with a timeout. The same advantages, gradient norms and weights as a 1-process run for every method
(LoRA, and full fine-tuning with a sharded KL reference and clipping), each rank holding a shard of the denoiser:
tests/methods/test_two_ranks_equal_one.py."""

from pathlib import Path

import pytest
import torch

from flowrl.checkpoints.sharded import load_consolidated
from tests.cli.test_ddp_configs import finish, fit, one_process, summary, two_nodes
from tests.cli.test_fit import fit_args, load_steps, run_cli
from tests.methods.fits_in_one_process import run_in_one_process

FSDP2 = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


def test_fsdp2_resume_from_a_sharded_checkpoint_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    extra = [*FSDP2, "--trainer.callbacks+=flowrl.callbacks.EMA", "--trainer.callbacks.apply_at_end=false",
             "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
             "--trainer.callbacks.every_n_train_steps=2", "--trainer.callbacks.save_top_k=-1",
             # validation swaps the EMA shards in and out on every rank (one validation prompt per rank)
             "--data.val_prompts=[red 1 and blue 2, green 3 and red 4]", "--trainer.limit_val_batches=1.0"]
    args = lambda out, *more: fit_args(tiny_model_dir, tmp_path / out, *extra,  # noqa: E731
                                       f"--trainer.callbacks.dirpath={tmp_path / out}/ckpt", *more)
    # 2 batches an epoch: step 2 ends epoch 0. The three fits share one process group (one start-up)
    saved = tmp_path / "first/ckpt/epoch=0-step=2.ckpt"
    run_in_one_process([args("straight", "--trainer.max_steps=4"), args("first", "--trainer.max_steps=2"),
                        args("resumed", "--trainer.max_steps=4", f"--ckpt_path={saved}")], tmp_path)
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


def test_fsdp2_on_two_nodes_of_one_process_equals_one_process(tmp_path, capsys, monkeypatch):
    # Lightning's cluster variables on localhost, as a SLURM or torchrun launch sets them: one data-parallel rank per
    # process over both nodes
    config = "tiny_flow_grpo.yaml"
    one = one_process(config, tmp_path / "one", capsys, monkeypatch)
    nodes = two_nodes(config, tmp_path / "nodes", "fsdp2")
    assert summary(nodes[0]) == one
    finish(nodes[1])


def test_a_one_process_checkpoint_resumes_under_fsdp2(tiny_model_dir, tmp_path):
    # its optimizer states are keyed by position in the optimizer (the trained LoRA weights only), which Lightning's
    # FSDP2 loader read as positions among every weight of the module: "Missing optimizer state for parameter ..."
    ckpt = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps=2", "--trainer.callbacks.save_top_k=-1"]
    run_in_one_process([fit_args(tiny_model_dir, tmp_path / "straight", "--trainer.max_steps=4"),  # one start-up
                        fit_args(tiny_model_dir, tmp_path / "first", "--trainer.max_steps=2", *ckpt)], tmp_path)
    saved = next(Path(tmp_path / "first").rglob("*step=2.ckpt"))
    assert saved.is_file()  # one file, from one process
    run_cli(fit_args(tiny_model_dir, tmp_path / "resumed", "--trainer.max_steps=4", f"--ckpt_path={saved}", *FSDP2),
            tmp_path)
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
