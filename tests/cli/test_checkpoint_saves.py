"""No save leaves a broken checkpoint: a save that fails (a full disk, an interrupted write) keeps the previous one
whole, and ``last`` always names the newest complete checkpoint, also after ``kill -9`` of an FSDP2 rank 0 between
the periodic save and the ``last`` save."""

import errno
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

import flowrl.strategies.atomic_checkpoint as atomic
from flowrl.cli import main
from flowrl.strategies.atomic_checkpoint import AtomicCheckpointIO
from tests.cli.test_fit import fit_args

ROOT = Path(__file__).resolve().parents[2]
LAST_ONLY = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true",
             "--trainer.callbacks.save_top_k=0", "--trainer.callbacks.every_n_train_steps=1"]


def test_an_interrupted_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io, target = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(1000)}, target)

    def full_disk(obj, file):
        Path(file).write_bytes(b"PK\x03\x04 the first bytes of a zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.torch, "save", full_disk)
    with pytest.raises(OSError, match=rf"saving the checkpoint {target} failed \(No space left on device\); the "
                                      "previous last.ckpt is kept as it was"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(1000)}, target)
    assert torch.load(target)["global_step"] == 1 and torch.load(target)["w"].sum() == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the partial save was removed


def test_last_is_a_link_that_follows_every_complete_save(tmp_path):
    io = AtomicCheckpointIO()
    step = lambda n: tmp_path / f"epoch=0-step={n}.ckpt"  # noqa: E731
    io.save_checkpoint({"global_step": 1}, step(1))  # ModelCheckpoint's order: the periodic save, then `last`
    io.save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").is_symlink() and torch.load(tmp_path / "last.ckpt")["global_step"] == 1
    io.save_checkpoint({"global_step": 2}, step(2))  # a process killed here: `last` already names step 2
    assert (tmp_path / "last.ckpt").resolve() == step(2)
    io.remove_checkpoint(step(1))  # save_top_k=1 removes the previous one
    io.save_checkpoint({"global_step": 2}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    io.remove_checkpoint(tmp_path / "last.ckpt")  # a link: only the link goes
    assert step(2).is_file()


def can_mount() -> bool:
    probe = Path(f"/tmp/flowrl-mount-probe-{uuid.uuid4().hex}")
    probe.mkdir()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True)
        return ok
    except OSError:
        return False
    finally:
        probe.rmdir()


class GrowingState(Callback):
    """A callback whose checkpointed state grows by ``size`` bytes from ``step`` on (as an EMA that starts later):
    the checkpoint of ``step`` needs more room than the one before it."""

    def __init__(self, size: int, step: int):
        self.size, self.step, self.global_step = size, step, 0

    def on_train_batch_end(self, trainer, *args):
        self.global_step = trainer.global_step

    def state_dict(self):
        return {"buffer": torch.zeros(self.size if self.global_step >= self.step else 0, dtype=torch.uint8)}


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root (CAP_SYS_ADMIN); the injected write error "
                                            "above covers the same rule")
def test_a_full_disk_during_a_save_keeps_the_previous_last_checkpoint(tiny_model_dir, tmp_path):
    # the checkpoint folder on a 1 MiB tmpfs (the temp folder elsewhere, as on a cluster): the step-1 checkpoint of
    # the tiny model (~0.74 MB) fits; the step-2 one, 0.4 MB larger, does not, even in place of it
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        with pytest.raises(OSError, match="kept as it was"):
            main(fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=3", *LAST_ONLY,
                          f"--trainer.callbacks.dirpath={disk}", "--trainer.callbacks+=tests.cli.test_checkpoint_saves"
                          ".GrowingState", "--trainer.callbacks.size=400000", "--trainer.callbacks.step=2"))
        assert torch.load(disk / "last.ckpt", weights_only=False)["global_step"] == 1  # whole, the first step's
        assert [p.name for p in disk.iterdir()] == ["last.ckpt"]  # no partial save left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)  # lazy: a failed test may hold a file open there


class KillAtLastSave(Callback):
    """SIGKILLs rank zero at the second save of ``step``: after the periodic checkpoint, before ``last``."""

    def __init__(self, step: int):
        self.step, self.saves = step, 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.global_step == self.step and trainer.global_rank == 0:
            self.saves += 1
            if self.saves == 2:
                os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def killed_fsdp2_run(tmp_path_factory, tiny_model_dir):
    """A 2-process FSDP2 run (a checkpoint and ``last`` every step) whose rank 0 was SIGKILLed at step 3 between the
    periodic save and the ``last`` save; its checkpoint folder and the process's output."""
    out = tmp_path_factory.mktemp("fsdp2_killed")
    ckpt = out / "ckpt"
    args = fit_args(tiny_model_dir, out, "--trainer.max_steps=4", "--trainer.devices=2",
                    "--trainer.strategy=fsdp2", "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                    "--trainer.callbacks.save_last=true", "--trainer.callbacks.every_n_train_steps=1",
                    f"--trainer.callbacks.dirpath={ckpt}", "--trainer.callbacks+=tests.cli.test_checkpoint_saves"
                    ".KillAtLastSave", "--trainer.callbacks.step=3")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowrl", *args], cwd=out, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=400)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # rank 1, left waiting for its peer
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    return ckpt


def test_after_kill_9_of_fsdp2_rank_zero_last_is_the_newest_complete_checkpoint(killed_fsdp2_run):
    last = killed_fsdp2_run / "last.ckpt"
    assert (last / "meta.pt").is_file() and len(list(last.glob("*.distcp"))) == 2  # complete: both ranks' shards
    assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == 3


def test_predict_of_an_fsdp2_runs_folder_takes_one_process(killed_fsdp2_run, tmp_path):
    # the run's config.yaml says 2 devices and fsdp2; predict writes one folder from one process, loading the
    # sharded checkpoint into FSDP2 on it
    # (a process of its own, as a user runs it: FSDP2 in the test's process would keep its process group, and the
    # port Lightning picked, for every later test)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "flowrl", "predict", "--ckpt_path", str(killed_fsdp2_run), "--prompts",
                           "red 1 and blue 2", "--seeds", "0", "1", "--out", str(tmp_path / "images")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len(list((tmp_path / "images").glob("0*_seed*.png"))) == 2
