"""A stopped or doomed run says so: SIGTERM ends a training run with a non-zero status after Lightning's checkpoint
on exception, and a folder the run cannot write fails before the first rollout instead of at the first save."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from tests.cli.test_fit import fit_args

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_exits_non_zero_after_the_checkpoint_on_exception(tiny_model_dir, tmp_path):
    args = fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=100000",
                    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                    f"--trainer.callbacks.dirpath={tmp_path}/ckpt", "--trainer.callbacks.save_on_exception=true",
                    "--trainer.callbacks.every_n_epochs=0")  # no periodic saves: a file can only be the one on exception
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowrl", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = tmp_path / "dump" / "step1_rank0.pt"  # DumpOutputs writes it after the second batch
    deadline = time.monotonic() + 300
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started.exists(), proc.communicate()[0][-3000:] if proc.poll() is not None else "no batch in 300 s"
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run did not stop within 120 s of SIGTERM")
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]  # 143, as a shell reports a SIGTERM'd command
    (saved,) = (tmp_path / "ckpt").glob("*.ckpt")
    assert torch.load(saved, weights_only=False)["global_step"] >= 2


def test_an_unwritable_checkpoint_folder_fails_before_the_first_rollout(tiny_model_dir, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")  # nothing can be created below a file, even by root
    with pytest.raises(PermissionError, match=rf"cannot write to {blocker}/ckpt .*ModelCheckpoint dirpath"):
        main(fit_args(tiny_model_dir, tmp_path, "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                      f"--trainer.callbacks.dirpath={blocker}/ckpt"))
    assert not list((tmp_path / "dump").glob("step*.pt"))  # no batch was sampled
