"""Every method logs the same core metrics under the same names: a one-batch ``fit`` of each method (the matrix test's
small options, ``tests/policies/method_matrix.py``) on the random-weight tiny model, its CSV log read back."""

import csv
from pathlib import Path

import pytest
import yaml

from flowrl.cli import main
from tests.policies.method_matrix import METHODS, config

#: docs/concepts.md ("Logged metrics, the same names for every method") and docs/failure-handling.md, written out
CORE = {"train/reward/total", "train/advantage/mean", "train/advantage/std", "train/loss", "train/grad_norm",
        "train/nonfinite_steps", "train/forward_passes", "train/untrained_batches", "rollout/nfe",
        "rollout/forward_passes", "rollout/evaluations", "rollout/nfe_per_trained_step", "rollout/samples_per_s"}
#: the update's model evaluations per sample (a CFG pair: 2) with the matrix's options (T = 3, guidance 2)
PASSES = {
    # 2 trained steps (floor(3 x 0.99)) x a CFG pair x 2 passes (check_ratio's before the update, then the update's)
    "flow_grpo": 2 * 2 * 2,
    # M = 1 of K = 2 steps: fake score 3 + surrogate 5 + generator 4 + the surrogate's guided term 2 and its
    # reference 1 (docs/methods/tdm_r1.md: 15 per trained step)
    "tdm_r1": 3 + 5 + 4 + 3,
    # 2 noise levels per sample (floor(3 x 0.99)) x (old, policy, reference)
    "diffusion_nft": 2 * 3,
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_logs_the_core_metrics(method, tiny_model_dir, tmp_path):
    spec = config(method, "sd3", tiny_model_dir, tmp_path)
    spec["model"]["init_args"]["policy"] = {"class_path": "flowrl.policies.TinyFlowPolicy",
                                            "init_args": {"model": tiny_model_dir, "lora": {"rank": 4, "alpha": 8}}}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(spec))
    main(["fit", "--config", str(tmp_path / "fit.yaml")])
    rows = list(csv.DictReader(open(next(Path(tmp_path).rglob("metrics.csv")))))
    logged = {k: float(v) for row in rows for k, v in row.items() if v}
    assert CORE <= set(logged), sorted(CORE - set(logged))
    assert logged["train/nonfinite_steps"] == 0.0 and logged["train/untrained_batches"] == 0.0
    assert logged["train/forward_passes"] > 0 and logged["train/grad_norm"] > 0  # the update ran and counted
    if method in PASSES:
        assert logged["train/forward_passes"] == PASSES[method]
