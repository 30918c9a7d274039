"""TDM-R1 under FSDP2 (2 CPU processes, ``--trainer.strategy=fsdp2``): a resume from the sharded checkpoint folder
equals an uninterrupted run, every adapter's weights, every adapter's optimizer state and the generator's EMA (its
shards swapped in and out by a validation on every rank) included, and ``python -m flowrl export`` writes the
generator's LoRA from such a folder for the plain diffusers pipeline. The 2-process runs equal to 1-process runs, of
every method under DDP and FSDP2, are in ``test_two_ranks_equal_one.py``."""

from pathlib import Path

import torch

from flowrl.checkpoints.sharded import load_consolidated
from tests.cli.test_fit import load_steps
from tests.methods.likelihood_free import CHECKPOINTS, assert_export_matches_pipeline, sd3_fit_config, shrunk
from tests.two_process_group import GROUP, module_folder

ADAPTERS = ("default", "fake_score", "surrogate", "surrogate_old")
FSDP2 = ("--trainer.devices=2", "--trainer.strategy=fsdp2")
SAVED = "straight/ckpt/epoch=0-step=2.ckpt"  # the uninterrupted run's, as a run stopped at step 2 writes it
EXPORT = ("flowrl.methods.TDMR1", "    num_train_steps: 2\n    time_shift: 3.0\n    guidance_scale: 1.0")


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """TDM-R1 under FSDP2 straight for 4 steps with a checkpoint every 2, and resumed from its step 2 to 4 (2
    batches an epoch, one step each: step 2 ends epoch 0), validating after every 2 batches (one prompt per rank) with
    the config's EMA of the generator; a one-step fit on the tiny SD3 pipeline to export. No 1-process fit
    (``tests/two_process_group.py``)."""
    def args(out: Path, *extra: str) -> list[str]:
        return shrunk("tiny_tdm_r1.yaml", out, *FSDP2, "--model.init_args.generator_init=null", *CHECKPOINTS,
                      f"--trainer.callbacks.dirpath={out}/ckpt", "--trainer.val_check_interval=2", *extra,
                      model_dir=models["tiny"])

    (folder / "export").mkdir(parents=True, exist_ok=True)
    return [], [args(folder / "straight", "--trainer.max_steps=4"),
                args(folder / "resumed", "--trainer.max_steps=4", f"--ckpt_path={folder / SAVED}"),
                ["fit", "--config", str(sd3_fit_config(folder / "export", models["sd3"], *EXPORT)), *FSDP2]]


@GROUP
def test_tdm_r1_resumes_exactly_from_a_sharded_checkpoint(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__)
    saved = tmp_path / SAVED
    assert saved.is_dir() and len(list(saved.glob("*.distcp"))) == 2  # one shard file per rank

    straight, resumed = load_steps(tmp_path / "straight"), load_steps(tmp_path / "resumed")
    assert sorted(resumed) == ["step2_rank0", "step2_rank1", "step3_rank0", "step3_rank1"]
    for key in resumed:  # the sampler's position and every adapter carried over: the same rollouts and advantages
        for field in ("seeds", "rewards", "advantages"):
            assert torch.equal(straight[key][field], resumed[key][field]), (key, field)
    a, b = (load_consolidated(next((tmp_path / run).rglob("*step=4.ckpt"))) for run in ("straight", "resumed"))
    assert {name for name in ADAPTERS if any(f".{name}." in k for k in a["state_dict"])} == set(ADAPTERS)
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    optimizers = sorted(k for k in a if k.startswith("optimizer_"))
    assert optimizers == ["optimizer_0", "optimizer_1", "optimizer_2"]  # the generator, fake score and surrogate's
    for name in optimizers:  # AdamW's moments of each adapter, gathered from both ranks' shards
        assert a[name]["state"] and a[name]["state"].keys() == b[name]["state"].keys()
        for k, state in a[name]["state"].items():
            assert all(torch.equal(v, b[name]["state"][k][s]) for s, v in state.items()), (name, k)
    (ema_a, ema_b) = ([s for key, s in c["callbacks"].items() if key.startswith("EMA")] for c in (a, b))
    assert len(ema_a) == len(ema_b) == 1 and ema_a[0]["num_updates"] == ema_b[0]["num_updates"] == 4  # resumed
    ema_a, ema_b = ema_a[0]["shadow"], ema_b[0]["shadow"]
    assert ema_a and all(".default." in k for k in ema_a)  # the generator's adapter alone (the config's adapter)
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)  # gathered from both ranks' shards
    assert any(not torch.equal(ema_a[k], a["state_dict"][k]) for k in ema_a)  # an average, not the weights


@GROUP
def test_tdm_r1_generator_exported_from_a_sharded_checkpoint_loads_in_the_diffusers_pipeline(sd3_dir,
                                                                                            two_process_fits):
    assert_export_matches_pipeline(module_folder(two_process_fits, __name__) / "export", sd3_dir, *EXPORT,
                                   list(ADAPTERS), fitted=True)
