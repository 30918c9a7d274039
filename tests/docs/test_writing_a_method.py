"""docs/methods/writing-a-method.md is executed: its method file, written out as it stands on the page, fits through
the CLI with the page's own command (shrunk to seconds); its hook gives the weights the page describes, by hand; its
option rule stops a bad value before any weight loads."""

import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from flowrl.methods.batch import Batch
from flowrl.policies import LoraOptions, TinyFlowPolicy
from tests.cli.test_fit import load_steps

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs/methods/writing-a-method.md").read_text()
SHRINK = ["--trainer.max_steps=2", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          "--data.num_groups=2", "--data.group_size=4", "--data.val_prompts=[red 1 and blue 2]",
          "--model.init_args.num_steps=4"]


@pytest.fixture()
def mymethods(tmp_path, monkeypatch):
    """The page's ``mymethods.py``, importable."""
    (code,) = re.findall(r"```python\n(# mymethods\.py\n.*?)```", PAGE, re.S)
    (tmp_path / "mymethods.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(ROOT)
    yield __import__("mymethods")
    sys.modules.pop("mymethods", None)


def page_command() -> list[str]:
    (command,) = re.findall(r"```bash\n(python -m flowrl fit .*?)\n```", PAGE, re.S)
    return shlex.split(command.replace("\\\n", " "))[3:]  # after "python -m flowrl"; a shell joins "\\" lines


def test_the_pages_method_fits_with_the_pages_command(mymethods, tiny_model_dir, tmp_path):
    args = page_command()
    assert args[:3] == ["fit", "--config", "configs/tiny_flow_grpo.yaml"]
    main([*args, *SHRINK, f"--model.init_args.policy.init_args.model={tiny_model_dir}",
          f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.callbacks+=tests.cli.dump_outputs.DumpOutputs",
          f"--trainer.callbacks.out={tmp_path / 'run' / 'dump'}"])
    steps = load_steps(tmp_path / "run")
    assert sorted(steps) == ["step0_rank0", "step1_rank0"]
    weights = torch.load(tmp_path / "run" / "dump" / "weights.pt")
    assert any(w.abs().sum() > 0 for name, w in weights.items() if "lora_B" in name)  # LoRA B starts at 0


def test_the_hook_weights_each_step_by_its_noise_level(mymethods, tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    method = mymethods.SigmaWeightedGRPO(policy, num_steps=4, power=2.0, timestep_fraction=0.5, guidance_scale=1.0)
    batch = {"prompts": ["red 1 and blue 2"] * 2, "group_ids": torch.zeros(2).long(), "seeds": torch.tensor([3, 4])}
    with torch.no_grad():
        rollout = method.rollout(batch, policy.encode(batch["prompts"]))
    credit = method.apply_hooks(Batch.of(rollout, total=torch.tensor([0.2, 0.6]), valid=torch.ones(2).bool()))
    sigmas = policy.sigmas(4)  # trained: the first floor(4 * 0.5) = 2 steps, from sigma_0 and sigma_1
    mean = (sigmas[0] + sigmas[1]) / 2
    expected = (sigmas[:-1] / mean) ** 2
    assert torch.allclose(credit.loss_weights, expected.expand(2, -1), atol=1e-6)
    assert credit.loss_weights[0, 0] > 1 > credit.loss_weights[0, 1]  # the noisier step counts more


def test_the_pages_option_rule_stops_a_bad_value_before_loading(mymethods, tmp_path):
    with pytest.raises(SystemExit, match=r"model.power=-1.0 must be >= 0"):
        main([*page_command(), "--model.init_args.power=-1", f"--model.init_args.policy.init_args.model={tmp_path}/no"])
