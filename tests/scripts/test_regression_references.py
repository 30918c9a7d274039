"""The kept regression references in docs/data/regression/ (how each was recorded: its README.md): a fit rerun as
recorded equals its reference bit for bit on every column both have (scripts/compare_metrics.py), so a change that
moves a method's numbers fails here unless the reference is re-recorded with the reason.

Each full recording reruns in its own process at OMP_NUM_THREADS=1: the thread count, the CPU's vector instructions
and library versions change float reductions, so the references hold for one thread on the machine and libraries the
README names. The full recordings take minutes and are slow tests; the default suite reruns TDM-R1's first batch
(the validation before training and batch 0: its rollout, rewards, the three adapters' losses and gradient norms) in
pytest's process at one torch thread and holds it to the reference within 1e-5, which a change of machine keeps and
a change of code does not."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ROOT / "docs" / "data" / "regression"
spec = importlib.util.spec_from_file_location("compare_metrics", ROOT / "scripts" / "compare_metrics.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

# (reference, config, fit options): the README's commands
QUICKSTART = ("quickstart_seed0_20batches.csv", "quickstart", ["--trainer.max_steps=40"],
              "docs/data/regression/quickstart_recorded.yaml")
TREE_RPO = ("tiny_tree_rpo_seed0_4batches.csv", "tiny_tree_rpo",
            ["--trainer.max_steps=4", "--trainer.limit_val_batches=1"])
TDM_R1 = ("tiny_tdm_r1_seed0_5batches.csv", "tiny_tdm_r1", ["--trainer.max_steps=5", "--trainer.limit_val_batches=1"])


def fit_metrics(config: str, options: list[str], root: Path, path: str | None = None) -> list[dict[str, str]]:
    """The metrics of ``configs/<config>.yaml`` (or the config file at ``path``, logging under ``config``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "flowrl", "fit", "--config", path or f"configs/{config}.yaml", *options,
                           f"--trainer.default_root_dir={root}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics,) = root.glob(f"{config}/version_*/metrics.csv")
    return compare.read(metrics)


def assert_matches(reference: str, run: list[dict[str, str]], rows: int | None = None, rtol: float = 0.0) -> None:
    expected = compare.read(REFERENCES / reference)[:rows]
    run = run[:rows]
    found = compare.differences(expected, run, rtol=rtol)
    assert len(expected) > 1 and not found, (
        f"{reference} differs: {found[:5]} (if no commit changed the numbers, the machine or a library did: rerun the "
        "reference's own commit here to tell; docs/data/regression/README.md)")
    shared = [c for c in expected[0] if c in run[0] and c not in compare.TIMINGS]
    # what "equal" covers: the training metrics, not only the step counter
    assert {"train/reward/total", "val/reward/total", "train/advantage/std"} <= set(shared), shared


def test_tdm_r1_first_batch_matches_its_reference(tmp_path, monkeypatch):
    # within 1e-5 here, bit for bit under -m slow: the default suite runs wherever CI runs, and another CPU's vector
    # kernels move the 7th digit (README), while a change of code moves far more than that; in this process at one
    # torch thread (a launched one would spend more CPU on its imports than on the fit)
    from flowrl.cli import main

    monkeypatch.chdir(ROOT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        main(["fit", "--config", "configs/tiny_tdm_r1.yaml", "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
              f"--trainer.default_root_dir={tmp_path}"])
    finally:
        torch.set_num_threads(threads)
    (metrics,) = tmp_path.glob("tiny_tdm_r1/version_*/metrics.csv")
    assert_matches(TDM_R1[0], compare.read(metrics), rows=2, rtol=1e-5)  # the validation before training and batch 0


@pytest.mark.slow
@pytest.mark.parametrize("case", [QUICKSTART, TREE_RPO, TDM_R1], ids=lambda case: case[1])
def test_recorded_run_matches_its_reference(case, tmp_path):
    reference, config, options, *path = case
    assert_matches(reference, fit_metrics(config, options, tmp_path, *path))
