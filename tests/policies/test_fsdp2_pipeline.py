"""FSDP2 on the tiny SD3 pipeline (2 CPU processes, ``--trainer.strategy=fsdp2``): LoRA and full fine-tuning equal a
1-process run (advantages, weights, an on-policy first update), and ``python -m flowrl export`` turns the sharded
checkpoint into files the plain diffusers pipeline loads: the LoRA weights, the EMA average, the whole pipeline."""

from pathlib import Path

import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from peft.utils import get_peft_model_state_dict

from flowrl.cli import main
from flowrl.checkpoints.sharded import load_consolidated
from tests.cli.test_fit import assert_two_ranks_equal_one, load_steps
from tests.policies.test_sd3 import HERE, fit_args, metrics
from tests.two_process_group import GROUP, module_folder

COMMON = ["--trainer.max_steps=2", "--model.init_args.optimizer=torch.optim.SGD",
          "--model.init_args.optimizer.lr=1.0", "--model.init_args.max_grad_norm=null",
          "--trainer.callbacks+=tests.cli.dump_outputs.DumpOutputs"]
SHARDED = ["--trainer.devices=2", "--trainer.strategy=fsdp2",
           "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
           "--trainer.callbacks.every_n_train_steps=2", "--trainer.callbacks+=flowrl.callbacks.EMA",
           "--trainer.callbacks.apply_at_end=false"]


def args(sd3_dir, out: Path, full: bool, *extra: str) -> list[str]:
    """A fit of the tiny SD3 pipeline, LoRA or ``full`` fine-tuning."""
    layers = ["--config", str(HERE / "full_finetune.yaml")] if full else []
    return fit_args(sd3_dir, out, *layers, *COMMON, f"--trainer.callbacks.out={out}/dump",
                    f"--trainer.callbacks.full={str(full).lower()}", *extra)


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """LoRA and full fine-tuning on 1 process and on 2 under FSDP2 (``tests/two_process_group.py``)."""
    return ([args(models["sd3"], folder / kind / "one", kind == "full") for kind in ("lora", "full")],
            [args(models["sd3"], folder / kind / "two", kind == "full", *SHARDED) for kind in ("lora", "full")])


@GROUP
def test_fsdp2_lora_equals_one_process_and_exports_lora_and_ema(sd3_dir, two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__) / "lora"
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5  # on-policy with sharded weights (fp32)
    ckpt = next((tmp_path / "two").rglob("*step=2.ckpt"))
    assert ckpt.is_dir()
    saved = load_consolidated(ckpt)
    trained = {k[len("policy.denoiser."):].replace(".default", ""): v for k, v in saved["state_dict"].items()
               if "lora_" in k}
    final = torch.load(tmp_path / "two/dump/weights.pt")  # the 2-process run's last weights, gathered in the run
    assert all(torch.equal(trained[k[len("denoiser."):].replace(".default", "")], v) for k, v in final.items())
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "lora")])
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "ema"), "--ema"])
    average = next(s["shadow"] for k, s in saved["callbacks"].items() if k.startswith("EMA"))
    for folder, want in (("lora", trained), ("ema", {k[len("policy.denoiser."):].replace(".default", ""): v
                                                     for k, v in average.items()})):
        pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
        pipe.load_lora_weights(tmp_path / folder)
        loaded = get_peft_model_state_dict(pipe.transformer, adapter_name="default_0")
        assert sorted(loaded) == sorted(want) and all(torch.equal(loaded[k], want[k]) for k in want), folder
    assert any(not torch.equal(average[k], saved["state_dict"][k]) for k in average)  # the average is not the weights


@GROUP
def test_fsdp2_full_finetuning_equals_one_process_and_exports_the_pipeline(sd3_dir, two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__) / "full"
    one, two = load_steps(tmp_path / "one"), load_steps(tmp_path / "two")
    seeds = torch.cat([two[f"step0_rank{r}"]["seeds"] for r in (0, 1)])
    torch.testing.assert_close(torch.cat([two[f"step0_rank{r}"]["advantages"] for r in (0, 1)])[seeds.argsort()],
                               one["step0_rank0"]["advantages"][one["step0_rank0"]["seeds"].argsort()])
    w1, w2 = torch.load(tmp_path / "one/dump/weights.pt"), torch.load(tmp_path / "two/dump/weights.pt")
    assert len(w1) > 20 and w1.keys() == w2.keys()
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-7) for k in w1)
    ckpt = next((tmp_path / "two").rglob("*step=2.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "full")])
    loaded = StableDiffusion3Pipeline.from_pretrained(tmp_path / "full").transformer.state_dict()
    base = StableDiffusion3Pipeline.from_pretrained(sd3_dir).transformer.state_dict()
    assert {k[len("denoiser."):] for k in w2} <= loaded.keys()  # every trained weight (buffers come from the model)
    assert all(torch.equal(loaded[k[len("denoiser."):]], v) for k, v in w2.items())
    assert any(not torch.equal(loaded[k], base[k]) for k in base)  # trained, not the model it started from


def test_export_of_a_missing_sharded_checkpoint_names_both_forms(tmp_path):
    with pytest.raises(SystemExit, match=r"the folder of a sharded one \(FSDP2\)$"):  # one line, nothing to leave out
        main(["export", "--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "x")])
