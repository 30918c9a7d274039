"""No save leaves a broken checkpoint: a save that fails (a full disk, an interrupted write) keeps the previous one
whole (a file, or an FSDP2 folder whose save failed on one rank), and ``last`` always names the newest complete
checkpoint, also after ``kill -9`` of an FSDP2 rank 0 between the periodic save and the ``last`` save."""

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

import flowrl.checkpoints.atomic as atomic
from flowrl.checkpoints.atomic import AtomicCheckpointIO
from flowrl.checkpoints.paths import checkpoint_problems
from flowrl.checkpoints.sharded import load_consolidated
from flowrl.cli import main
from tests.cli.test_fit import fit_args

# one xdist worker runs this file (pytest's --dist loadgroup): its module's 2-process FSDP2 run (killed_fsdp2_run)
# is built once, not once per worker
pytestmark = pytest.mark.xdist_group("killed_fsdp2_run")

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


class FullDiskFrom(Callback):
    """Makes every checkpoint write to a path beside its target (the atomic writer's ``.partial`` file, or a sharded
    folder's ``meta.pt`` in it) fail as a full disk does from the ``n``-th on: the file is begun, then ENOSPC. The
    checkpoints' states as saved are kept in ``states`` (class-wide: the CLI makes the instance)."""

    states: list = []

    def __init__(self, n: int = 2):
        self.n, self.writes = n, 0

    def setup(self, trainer, pl_module, stage):
        self.real_save = real = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)) and ".partial" in str(f):  # not a stream (dcp's shards), not a dump
                self.writes += 1
                if self.writes >= self.n:
                    Path(f).write_bytes(b"PK\x03\x04 the first bytes of a zip")
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(obj, f, *args, **kwargs)

        torch.save = save

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        FullDiskFrom.states.append({k: v.detach().clone() for k, v in checkpoint["state_dict"].items()})

    def on_exception(self, *_):
        self.teardown()

    def teardown(self, *_):
        torch.save = getattr(self, "real_save", torch.save)


def test_a_save_that_fails_in_a_fit_keeps_the_previous_last_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    # no root needed: the write error is injected where the atomic writer calls torch.save (the tmpfs test below is
    # the real full disk); step 1's last.ckpt is written, step 2's fails half-way
    monkeypatch.setattr(torch, "save", torch.save)  # put back whatever happens
    FullDiskFrom.states = []
    ckpt = tmp_path / "ckpt"
    with pytest.raises(OSError, match=rf"saving the checkpoint {ckpt}/last.ckpt failed \(No space left on device\); "
                                      "the previous last.ckpt is kept as it was"):
        main(fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=3", *LAST_ONLY, f"--trainer.callbacks.dirpath="
                      f"{ckpt}", "--trainer.callbacks+=tests.cli.test_checkpoint_saves.FullDiskFrom"))
    assert [p.name for p in ckpt.iterdir()] == ["last.ckpt"]  # no partial save left
    assert checkpoint_problems(str(ckpt / "last.ckpt")) == []  # a complete checkpoint, as resume checks it
    kept = torch.load(ckpt / "last.ckpt", weights_only=False)
    first, failed = FullDiskFrom.states  # what step 1's save and step 2's held
    assert kept["global_step"] == 1 and kept["state_dict"].keys() == first.keys()
    assert all(torch.equal(kept["state_dict"][k], first[k]) for k in first)  # step 1's, tensor for tensor
    assert any(not torch.equal(failed[k], first[k]) for k in first)  # and step 2 had changed them: not its save


def fit_in_own_session(args: list[str], cwd: Path) -> tuple[int, str]:
    """``python -m flowrl`` with ``args`` in a process group of its own, killed whole when it returns (a rank left
    waiting for a peer that failed or was killed); its return code and output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowrl", *args], cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=400)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, output


@pytest.mark.slow  # a 2-process FSDP2 run
def test_a_save_that_fails_on_one_fsdp2_rank_keeps_the_previous_sharded_checkpoint(tiny_model_dir, tmp_path):
    # rank 0's meta.pt of step 2 fails half-way, after both ranks wrote their shards: both ranks raise (none waits
    # for the other), and the step-1 folder is whole
    ckpt = tmp_path / "ckpt"
    args = fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=3", "--trainer.devices=2",
                    "--trainer.strategy=fsdp2", *LAST_ONLY, f"--trainer.callbacks.dirpath={ckpt}",
                    "--trainer.callbacks+=tests.cli.test_checkpoint_saves.FullDiskFrom")
    returncode, output = fit_in_own_session(args, tmp_path)
    assert returncode != 0
    assert (f"saving the checkpoint {ckpt}/last.ckpt failed (No space left on device); the previous last.ckpt is kept "
            "as it was") in output, output[-3000:]
    assert [p.name for p in ckpt.iterdir()] == ["last.ckpt"]  # no partial folder left
    last = ckpt / "last.ckpt"
    assert len(list(last.glob("*.distcp"))) == 2 and load_consolidated(last)["global_step"] == 1  # whole, step 1's


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
    returncode, output = fit_in_own_session(args, out)
    assert returncode == -signal.SIGKILL, output[-3000:]
    return ckpt


def test_after_kill_9_of_fsdp2_rank_zero_last_is_the_newest_complete_checkpoint(killed_fsdp2_run):
    last = killed_fsdp2_run / "last.ckpt"
    assert (last / "meta.pt").is_file() and len(list(last.glob("*.distcp"))) == 2  # complete: both ranks' shards
    assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == 3


def test_predict_of_an_fsdp2_runs_folder_takes_one_process(killed_fsdp2_run, tmp_path, monkeypatch):
    # the run's config.yaml says 2 devices and fsdp2; predict writes one folder from one process, loading the
    # sharded checkpoint into FSDP2 on it (in this process: the suite's autouse no_process_group_outlives_a_test ends
    # the 1-process group it makes and puts back the variables Lightning set)
    monkeypatch.chdir(tmp_path)
    main(["predict", "--ckpt_path", str(killed_fsdp2_run), "--prompts", "red 1 and blue 2", "--seeds", "0", "1",
          "--out", str(tmp_path / "images")])
    assert torch.distributed.is_initialized()  # FSDP2 ran on a 1-process group, not a plain module
    assert len(list((tmp_path / "images").glob("0*_seed*.png"))) == 2
