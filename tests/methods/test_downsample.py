"""PODS (``model.downsample_to``): the hooks credit only each group's max-variance rows, with the estimator's
advantages on those rows alone; a fit runs the training pass of exactly those rows; the option is refused where it
cannot apply, before any weight loads."""

import csv
from pathlib import Path

import pytest
import torch
import yaml

from flowrl import advantages as adv_lib
from flowrl.cli import main
from flowrl.methods import DenseGRPO, FlowGRPO, TempFlowGRPO, TPGRPO
from flowrl.methods.batch import Batch
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.sampling.rollout import Rollout
from tests.cli.no_weights import refuse_weights
from tests.methods.options import option_problems
from tests.policies.method_matrix import config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=8))  # built: configs only, no weight


def gathered(total: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor, steps: int = 3) -> Batch:
    batch = len(total)
    rollout = Rollout(prompts=["p"] * batch, group_ids=group_ids, seeds=torch.arange(batch),
                      latents=torch.zeros(batch, steps + 1, 1), log_probs=torch.zeros(batch, steps),
                      sigmas=torch.linspace(1, 0, steps + 1).expand(batch, -1),
                      train_mask=torch.ones(batch, steps, dtype=torch.bool))
    return Batch.of(rollout, total=torch.where(valid, total, 0.0), valid=valid)


def test_the_hooks_credit_each_groups_max_variance_rows_with_the_estimators_advantages_on_them_alone(policy):
    module = FlowGRPO(policy, num_steps=3, timestep_fraction=1.0, downsample_to=2)
    total = torch.tensor([0.0, 1.0, 2.0, 10.0, 0.3, 0.9, 0.5, 0.1])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    valid = torch.tensor([True, True, True, True, True, False, True, True])  # row 5 (0.9) has no reward
    credit = module.apply_hooks(gathered(total, groups, valid))
    kept = torch.tensor([True, False, False, True, False, False, True, True])  # {0, 10}; of {0.3, 0.5, 0.1}: {0.5, 0.1}
    assert torch.equal(credit.trained, kept[:, None].expand(-1, 3))
    assert torch.equal(credit.valid, valid)  # the reward of every row is still logged
    assert credit.diagnostics["kept_rows"] == 4.0
    alone = adv_lib.compute("grpo@flow_grpo", credit.step_rewards[kept], torch.ones(4, 3, dtype=torch.bool),
                            groups[kept])  # the batch std too is the kept rows'
    assert torch.equal(credit.advantages[kept], alone) and not credit.advantages[~kept].any()
    assert torch.equal(credit.loss_weights[kept], torch.ones(4, 3)) and not credit.loss_weights[~kept].any()
    plain = FlowGRPO(policy, num_steps=3, timestep_fraction=1.0).apply_hooks(gathered(total, groups, valid))
    assert torch.equal(plain.trained, torch.ones(8, 3, dtype=torch.bool))  # off: every row, as before


def test_the_option_is_refused_where_it_cannot_apply(policy):
    assert option_problems(FlowGRPO, policy, downsample_to=4) == []
    (low,) = option_problems(FlowGRPO, policy, downsample_to=1)
    assert low.startswith("model.downsample_to=1 must be >= 2")
    (estimator,) = option_problems(FlowGRPO, policy, downsample_to=2, advantage="step_grpo@flow_grpo")
    assert "model.advantage='step_grpo@flow_grpo' gives one per (row, step)" in estimator
    for cls, credits in ((DenseGRPO, "a dense reward per step"), (TPGRPO, "turning points"),
                         (TempFlowGRPO, "per tree node")):
        (problem,) = option_problems(cls, policy, downsample_to=2)
        assert problem.startswith(f"model.downsample_to=2: {cls.__name__} credits") and credits in problem, problem
        assert "set model.downsample_to=null" in problem


def test_a_group_of_downsample_to_rows_or_fewer_is_refused_before_any_weight_loads(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    refuse_weights(monkeypatch)
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(ROOT / "configs" / "tiny_flow_grpo.yaml"), f"--trainer.default_root_dir={tmp_path}",
              f"--model.init_args.policy.init_args.model={tiny_model_dir}", "--model.init_args.downsample_to=8"])
    assert "model.downsample_to=8 keeps every row of a group of data.group_size=8" in str(err.value)
    assert "set model.downsample_to below 8 (e.g. 4)" in str(err.value)


def test_a_fit_runs_the_training_pass_of_exactly_the_kept_rows(tiny_model_dir, tmp_path, monkeypatch):
    spec = config("flow_grpo", "sd3", tiny_model_dir, tmp_path)  # T = 3 (2 trained steps), guidance 2, check_ratio
    spec["model"]["init_args"]["policy"] = {"class_path": "flowrl.policies.TinyFlowPolicy",
                                            "init_args": {"model": tiny_model_dir, "lora": {"rank": 4, "alpha": 8}}}
    spec["model"]["init_args"]["downsample_to"] = 2
    spec["data"].update(group_size=4, num_groups=2)
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(spec))
    chosen, transitioned = [], set()
    select, transition = adv_lib.max_variance_subset, PolicyGradient.transition

    def recording_select(*args):
        chosen.append(select(*args))
        return chosen[-1]

    def recording_transition(self, rollout, cond, pairs):
        transitioned.update(pairs[:, 0].tolist())
        return transition(self, rollout, cond, pairs)

    monkeypatch.setattr(adv_lib, "max_variance_subset", recording_select)
    monkeypatch.setattr(PolicyGradient, "transition", recording_transition)
    main(["fit", "--config", str(tmp_path / "fit.yaml")])
    (kept,) = chosen  # one batch, every row valid (JPEG size)
    assert int(kept.sum()) == 4 and transitioned == set(kept.nonzero().flatten().tolist())
    rows = list(csv.DictReader(open(next(Path(tmp_path).rglob("metrics.csv")))))
    logged = {k: float(v) for row in rows for k, v in row.items() if v}
    # 4 of 8 rows x 2 trained steps x a CFG pair x 2 passes (check_ratio's, the update's), per sample of the batch
    assert logged["train/forward_passes"] == 4 * 2 * 2 * 2 / 8 and logged["train/kept_rows"] == 4.0
