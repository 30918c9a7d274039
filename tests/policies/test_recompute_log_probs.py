"""``recompute_log_probs``: the old log-probs of the PPO ratio come from the update's own micro-batches, so the
first minibatch is exactly on-policy, where the sampled ones (another batch composition) are only close."""

import csv
from pathlib import Path

import pytest

from flowrl.cli import main
from tests.policies.test_sd3 import fit_args


def logged(out):
    rows = list(csv.DictReader(open(next(Path(out).rglob("metrics.csv")))))
    return {k: float(v) for row in rows for k, v in row.items() if v}


@pytest.mark.parametrize("recompute", [False, True])
def test_first_minibatch_ratio_is_exactly_one_with_recomputed_log_probs(sd3_dir, tmp_path, recompute):
    # sampling runs the 4 trajectories as one CFG batch of 8 rows; the update's micro-batches hold 1 pair (2 rows),
    # and float32 kernels of the two batch sizes round differently
    main(fit_args(sd3_dir, tmp_path, f"--model.init_args.recompute_log_probs={str(recompute).lower()}",
                  "--model.init_args.micro_batch_size=1", "--model.init_args.check_ratio_threshold=1.0"))
    metrics = logged(tmp_path)
    if recompute:
        assert metrics["train/check_ratio_max_dev"] == 0.0 and metrics["train/ratio_max_dev"] == 0.0
        assert metrics["train/clip_frac"] == 0.0
    else:
        assert 0.0 < metrics["train/check_ratio_max_dev"] < 1e-5
