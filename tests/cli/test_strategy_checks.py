"""``trainer.strategy`` from the command line: ``fsdp2`` is a registered one-word strategy, and settings a strategy
cannot run fail before any weight loads (the model path below does not exist, so reaching the loader would fail
differently), each naming the fix."""

import importlib.util
from typing import Optional

import pytest
import torch
from lightning.pytorch import Trainer

from flowrl.cli import main
from flowrl.cli.config_checks import method_without_policy
from flowrl.cli.run_checks import parsed_trainer
from flowrl.data import PromptDataModule
from flowrl.methods import FlowGRPO
from flowrl.strategies.checks import strategy_problems
from flowrl.strategies.fsdp2 import FSDP2Strategy
from tests.cli.no_weights import refuse_weights
from tests.cli.test_ddp_configs import ROOT
from tests.cli.test_fit import CONFIG

NO_MODEL = ["fit", "--config", CONFIG, "--model.init_args.policy.init_args.model=/no/such/model"]


def errors(capsys, *extra: str) -> str:
    with pytest.raises(SystemExit) as failure:
        main([*NO_MODEL, *extra])
    out = str(failure.value) + capsys.readouterr().err
    assert "/no/such/model" in out  # every problem is reported together, before loading
    return out


def test_fsdp2_is_a_registered_strategy_name():
    import flowrl.methods  # noqa: F401  registers it

    trainer = Trainer(strategy="fsdp2", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, FSDP2Strategy)


def test_lightnings_fsdp1_is_refused_with_fsdp2_as_the_fix(capsys):
    assert "use --trainer.strategy=fsdp2" in errors(capsys, "--trainer.devices=2", "--trainer.strategy=fsdp")


def test_deepspeed_on_cpu_names_the_extra_the_gpu_and_the_clip(capsys):
    out = errors(capsys, "--trainer.devices=2", "--trainer.strategy=deepspeed_stage_2")
    if importlib.util.find_spec("deepspeed") is None:
        assert "pip install 'flowrl[deepspeed]'" in out
    assert "runs on CUDA GPUs only" in out and "--model.init_args.max_grad_norm=null" in out
    out = errors(capsys, "--trainer.strategy=deepspeed_stage_3", "--model.init_args.max_grad_norm=null",
                 "--trainer.callbacks+=flowrl.callbacks.EMA")
    assert "EMA with DeepSpeed ZeRO-3" in out and "max_grad_norm" not in out


def test_fsdp2_needs_equal_validation_batches_on_every_rank(capsys):
    out = errors(capsys, "--trainer.devices=2", "--trainer.strategy=fsdp2", "--data.val_prompts=[a, b, c]",
                 "--data.val_batch_size=1")
    assert "3 validation samples over 2 ranks give [2, 1] batches" in out and "data.val_batch_size=2" in out
    with pytest.raises((SystemExit, OSError, ValueError)) as failure:  # 4 samples: 2 and 2, no strategy problem
        main([*NO_MODEL, "--trainer.devices=2", "--trainer.strategy=fsdp2", "--data.val_prompts=[a, b, c, d]",
              "--data.val_batch_size=1"])
    assert "validation batches" not in str(failure.value) + capsys.readouterr().err


def test_likelihood_free_methods_and_sharded_checkpoints_name_their_strategy(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's prompt files are relative to the repository
    with pytest.raises(SystemExit, match="model.class_path=TDMR1 .* use --trainer.strategy=ddp, or fsdp2"):
        main(["fit", "--config", "configs/tiny_tdm_r1.yaml", "--trainer.devices=2",
              "--trainer.strategy=deepspeed_stage_2",
              "--model.init_args.policy.init_args.model=/no/such/model"])
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    torch.save({}, folder / "meta.pt")  # what a sharded checkpoint folder holds beside the per-rank files
    out = errors(capsys, "--trainer.devices=2", "--trainer.strategy=ddp", f"--ckpt_path={folder}")
    assert "is a sharded (FSDP2) checkpoint folder: resume it with --trainer.strategy=fsdp2" in out


class UnclippedFlowGRPO(FlowGRPO):
    """A method whose declared default is no clipping."""

    def __init__(self, policy, max_grad_norm: Optional[float] = None, **kwargs):
        super().__init__(policy, max_grad_norm=max_grad_norm, **kwargs)


def test_deepspeeds_clip_check_reads_the_built_methods_option():
    # DeepSpeed is refused by Lightning on this machine: the trainer's parsed options stand in for the trainer
    trainer = parsed_trainer({"strategy": "deepspeed_stage_2", "accelerator": "gpu", "devices": 2})
    data = PromptDataModule(prompts=["a"])
    clip = lambda module: [p for p in strategy_problems(trainer, module, data) if "max_grad_norm" in p]  # noqa: E731
    assert len(clip(method_without_policy(FlowGRPO, {}))) == 1  # the base's default, 1.0, clips through the strategy
    assert clip(method_without_policy(UnclippedFlowGRPO, {})) == []  # its declared default: nothing to refuse
    assert clip(method_without_policy(FlowGRPO, {"max_grad_norm": None})) == []


def test_the_strategy_checks_read_the_built_trainers_strategy_object():
    module, data = method_without_policy(FlowGRPO, {}), PromptDataModule(prompts=["a"], val_prompts=["a", "b", "c"],
                                                                         val_batch_size=1)
    trainer = Trainer(strategy=FSDP2Strategy(), accelerator="cpu", devices=2, logger=False)
    assert strategy_problems(trainer, module, data) == [
        "trainer.strategy='FSDP2Strategy' runs each forward as a collective, so every rank must draw as many "
        "validation batches: 3 validation samples over 2 ranks give [2, 1] batches of data.val_batch_size=1; use "
        "data.val_batch_size=2 (one batch each) or a sample count divisible by 2"]
    assert strategy_problems(trainer, module, data, given="fsdp2")[0].startswith("trainer.strategy='fsdp2' runs")
    one = Trainer(strategy=FSDP2Strategy(), accelerator="cpu", devices=1, logger=False)
    assert strategy_problems(one, module, data) == []  # one rank draws every batch
    parallel = Trainer(strategy=FSDP2Strategy(tensor_parallel_size=2), accelerator="cpu", devices=2, logger=False)
    assert any("set tensor_parallel_size: 1" in p for p in strategy_problems(parallel, module, data))
    split = Trainer(strategy=FSDP2Strategy(context_parallel_size=2), accelerator="cpu", devices=2, logger=False)
    # the 2 processes of one context-parallel group are one replica: they draw the same 3 validation batches
    (plan,) = strategy_problems(split, module, data)  # a family's checks: tests/policies/test_wan_context_parallel
    assert "has no context-parallel plan in diffusers (`_cp_plan`)" in plan


def test_a_built_runs_strategy_problem_is_reported_by_fit(tiny_model_dir, monkeypatch):
    refuse_weights(monkeypatch)
    with pytest.raises(SystemExit) as failure:  # the run builds (weights refused): its trainer's strategy is read
        main(["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={tiny_model_dir}",
              "--trainer.strategy={class_path: flowrl.strategies.fsdp2.FSDP2Strategy}", "--trainer.devices=2",
              "--data.val_prompts=[a, b, c]", "--data.val_batch_size=1"])
    assert "trainer.strategy='FSDP2Strategy' runs each forward as a collective" in str(failure.value)
