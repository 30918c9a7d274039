"""``python -m flowrl fit`` with a non-default policy loss, and loss errors raised before any weight loads."""

import csv
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from flowrl.cli import main
from flowrl.methods import FlowGRPO
from flowrl.policies import LoraOptions
from tests.methods.options import option_problems
from tests.cli.test_fit import CONFIG, fit_args

ROOT = Path(__file__).resolve().parents[2]


def test_gspo_with_options_fits_and_logs_its_metrics(tiny_model_dir, tmp_path):
    main(fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=1", "--model.init_args.loss=gspo",
                  "--model.init_args.loss_options={clip_high: 0.3}", "--trainer.logger=CSVLogger",
                  f"--trainer.logger.save_dir={tmp_path}/logs"))
    weights = torch.load(tmp_path / "dump/weights.pt")
    assert any(w.abs().sum() > 0 for k, w in weights.items() if "lora_B" in k)  # it trained
    [metrics] = Path(tmp_path, "logs").rglob("metrics.csv")
    row = next(r for r in csv.DictReader(metrics.open()) if r.get("train/ratio_max"))
    # one inner epoch, one minibatch: the sequence ratio of the first (only) update is 1 up to recompute noise
    assert abs(float(row["train/ratio_max"]) - 1) < 1e-3 and float(row["train/clip_frac_high"]) == 0


def test_unknown_loss_or_option_fails_before_loading(tmp_path):
    missing = f"--model.init_args.policy.init_args.model={tmp_path / 'nope'}"  # would fail if it were loaded
    with pytest.raises(SystemExit, match=r"model.loss='ppo2': choose a policy loss from \['chunk_gspo', 'chunk_gspo@gcpo', 'cispo'"):
        main(["fit", "--config", CONFIG, "--model.init_args.loss=ppo2", missing])
    with pytest.raises(SystemExit, match="model.loss_options: policy loss 'cispo' has no option 'dual_clip'"):
        main(["fit", "--config", CONFIG, "--model.init_args.loss=cispo",
              "--model.init_args.loss_options={dual_clip: 3.0}", missing])


@pytest.mark.parametrize("config", ["quickstart.yaml", "tiny_flow_grpo.yaml"])
def test_shipped_configs_name_their_loss(config):
    init = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / config).model.init_args)
    policy, _ = init.pop("policy"), init.pop("optimizer")  # the method's own options, on the shipped policy
    policy["init_args"]["lora"] = LoraOptions(**policy["init_args"]["lora"])
    assert init["loss"] == "vanilla" and "loss_options" in init and option_problems(FlowGRPO, policy, **init) == []
