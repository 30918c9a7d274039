"""The method layer holds methods that break the one-trajectory-per-prompt shape: a toy tree method (more rows than
prompts, one tree per prompt, a shared prefix computed once, an edge trained once) samples, trains and fits through
the CLI; a method that is not policy gradient shows none of PPO's options. (A 2-process run whose ranks hold different numbers of trained pairs
equals a 1-process run: tests/methods/test_two_ranks_equal_one.py.)"""

import re
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from flowrl.policies import LoraOptions, TinyFlowPolicy
from tests.cli.test_fit import CONFIG, fit_args, load_steps
from tests.methods.test_nonfinite import KeepModule
from tests.methods.toy_branching import TwoBranches

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["red 1 and blue 2", "green 3 and red 4", "blue 5 and green 6"]


def with_method(tmp_path: Path, class_path: str) -> str:
    """tests/cli/fit_tiny.yaml with another method in place of FlowGRPO."""
    config = tmp_path / "config.yaml"
    config.write_text(Path(CONFIG).read_text().replace("class_path: flowrl.methods.FlowGRPO", f"class_path: {class_path}"))
    return str(config)


def method_fit_args(tiny_model_dir, out: Path, class_path: str, *extra: str) -> list[str]:
    """``fit_args`` (DumpOutputs included) on fit_tiny.yaml with ``class_path`` as the method."""
    args = fit_args(tiny_model_dir, out, *extra)
    args[2] = with_method(out.parent, class_path)
    return args


def test_a_toy_tree_has_more_rows_than_prompts_shares_its_prefix_and_trains_its_edges_once(tiny_model_dir):
    policy = TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8)).load()
    method = TwoBranches(policy, num_steps=4, branch_step=2, guidance_scale=2.0)
    batch = {"prompts": PROMPTS, "group_ids": torch.arange(3), "seeds": torch.tensor([7, 8, 9]),
             "cond_rows": torch.tensor([2, 0, 1])}  # rows in another order than the prompts they belong to
    with torch.no_grad():
        cond = policy.encode([PROMPTS[2], PROMPTS[0], PROMPTS[1]])  # cond row 2 is PROMPTS[1], ...
        rollout = method.rollout(batch, cond)
    assert rollout.batch_size == 6 and rollout.cond_rows.tolist() == [2, 2, 0, 0, 1, 1]
    leaves = rollout.latents.view(3, 2, *rollout.latents.shape[1:])  # [tree, leaf, T+1, ...]
    assert torch.equal(leaves[:, 0, :3], leaves[:, 1, :3])  # the prefix (noise, ODE step, shared SDE step) bit for bit
    assert not torch.equal(leaves[:, 0, 3], leaves[:, 1, 3])  # the branches have their own noise
    # the prefix was computed once per tree: each tree's trunk equals a plain 2-step sample of its prompt alone
    alone = TwoBranches(policy, num_steps=4, branch_step=2, guidance_scale=2.0)
    with torch.no_grad():
        single = alone.rollout({"prompts": [PROMPTS[1]], "group_ids": torch.tensor([0]), "seeds": torch.tensor([7])},
                               policy.encode([PROMPTS[1]]))
    assert torch.allclose(single.latents[0, :4], rollout.latents[0, :4], atol=1e-6)  # conditioned by cond row 2
    assert rollout.log_probs[:, 0].eq(0).all() and rollout.log_probs[:, 1:3].ne(0).all()  # ODE, SDE, SDE, ODE
    assert rollout.parent_ids[0].tolist() == [-1, -1, 0, 0] and rollout.depths[1].tolist() == [0, 0, 1, 1]
    once = rollout.trained_once()
    assert once[:, 1].tolist() == [True, False] * 3  # the shared SDE step: once per tree
    assert once[:, 2].all() and once.sum() == 9  # each leaf's own branch step
    assert rollout.nfe.tolist() == [3.0] * 6  # 2 trunk evaluations shared by 2 leaves + 2 of its own


def test_the_toy_tree_method_fits_through_the_cli(tiny_model_dir, tmp_path):
    brightness = ["--trainer.callbacks+=flowrl.rewards.FunctionReward", "--trainer.callbacks.weight=100",
                  "--trainer.callbacks.function=tests.rewards.reward_functions.brightness"]  # leaves differ by ~1e-3
    main(method_fit_args(tiny_model_dir, tmp_path / "run", "tests.methods.toy_branching.TwoBranches",
                         "--data.group_size=1", "--data.num_groups=2", "--model.init_args.branch_step=2", *brightness))
    tmp_path = tmp_path / "run"
    steps = load_steps(tmp_path)
    assert sorted(steps) == ["step0_rank0", "step1_rank0"]
    first = steps["step0_rank0"]
    assert len(first["seeds"]) == 4 and first["seeds"].view(2, 2).diff(dim=1).eq(0).all()  # 2 trees of 2 leaves
    advantages = first["advantages"]  # [4, T=3]: the shared step (1) has no sibling: 0; the branch step (2): +-
    assert advantages[:, 0].eq(0).all() and advantages[:, 1].eq(0).all()
    branch = advantages[:, 2].view(2, 2)
    assert torch.allclose(branch.sum(1), torch.zeros(2), atol=1e-4) and branch.abs().gt(0.5).all()
    weights = torch.load(tmp_path / "dump" / "weights.pt")
    assert any(w.abs().sum() > 0 for name, w in weights.items() if "lora_B" in name)


def method_help(class_path: str, capsys) -> dict[str, str]:
    """``python -m flowrl fit --model.help CLASS``: ``{option: its help text}`` (run in this process)."""
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", class_path])
    text = capsys.readouterr().out.split("\n\n", 2)[-1]
    options = {}
    for block in re.split(r"\n  (?=--model\.)", "\n" + text):
        flag, _, rest = block.strip().partition("\n")
        head, *same_line = re.split(r"\s{2,}", flag, maxsplit=1)  # a short flag's help starts on its own line
        name = head.split()[0] if head else ""
        if name.startswith("--model.") and not name.endswith(".help"):
            options[name.removeprefix("--model.")] = " ".join(" ".join([*same_line, rest]).split())
    return options


@pytest.mark.parametrize("class_path", ["flowrl.methods.FlowGRPO", "flowrl.methods.DenseGRPO",
                                        "flowrl.methods.TPGRPO", "tests.methods.base_only.ScoreOnly"])
def test_every_option_has_its_own_help_text(class_path, capsys):
    options = method_help(class_path, capsys)
    assert "guidance_scale" in options and "max_nonfinite_steps" in options
    undocumented = [name for name, text in options.items() if text.startswith(("(type:", "(required"))]
    assert not undocumented, f"{class_path}: options without help text: {undocumented}"


def test_tp_grpo_takes_no_timestep_fraction(capsys):
    assert "timestep_fraction" in method_help("flowrl.methods.FlowGRPO", capsys)
    assert "timestep_fraction" not in method_help("flowrl.methods.TPGRPO", capsys)  # its window decides


def test_a_method_that_is_not_policy_gradient_shows_no_ppo_options_and_fits(tiny_model_dir, tmp_path, capsys):
    options = method_help("tests.methods.base_only.ScoreOnly", capsys)
    assert "threshold" in options
    for ppo in ("clip_range", "num_minibatches", "micro_batch_size", "beta", "loss_options", "check_ratio"):
        assert ppo not in options
    # PPO's options are not silently accepted either
    with pytest.raises(SystemExit) as raised:  # named in one line before the parser reads the config
        main(method_fit_args(tiny_model_dir, tmp_path / "ppo", "tests.methods.base_only.ScoreOnly"))
    assert "ScoreOnly has no option" in str(raised.value) and "clip_range" in str(raised.value)
    config = tmp_path / "score_only.yaml"
    config.write_text(Path(CONFIG).read_text().split("model:")[0] + "model:\n  class_path: tests.methods.base_only.ScoreOnly"
                      "\n  init_args:\n    policy: {class_path: flowrl.policies.TinyFlowPolicy, init_args: {lora: {rank: 4}}}"
                      "\n    num_steps: 2\n    optimizer: {class_path: torch.optim.SGD, init_args: {lr: 1.0}}\n"
                      + "data:" + Path(CONFIG).read_text().split("data:")[1])
    main(["fit", "--config", str(config), f"--model.init_args.policy.init_args.model={tiny_model_dir}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=tests.methods.test_nonfinite.KeepModule"])
    lora_b = [p for n, p in KeepModule.last.policy.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # LoRA B starts at 0: the step trained
