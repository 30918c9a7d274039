"""Checkpoint saves that never leave a broken checkpoint, and a ``last`` that is always the newest complete one.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction, which stages the file in the system temp
folder and then *moves* it: across filesystems (a run folder on a cluster's shared disk, ``/tmp`` local) the move
is a copy, so a full disk leaves a truncated ``last.ckpt`` where the previous good one was. Here every save is
written beside its target (``.<name>.partial``, the same filesystem) and renamed over it with ``os.replace``: a
save that fails leaves the previous checkpoint as it was. A sharded (FSDP2) checkpoint folder is written the same
way, whole, before it replaces the old one; a write that fails on one process fails the save on every process (none
is left waiting for it), with the same message.

``last``: a ``last*.ckpt`` saved at the global step of the checkpoint just saved beside it is a symbolic link to it
(no second copy), and every later complete save re-points such a link before anything older is removed; so whenever
a process is killed, ``last`` names the newest complete checkpoint (a save killed half-way leaves only its
``.partial``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol


def partial_path(target: Path) -> Path:
    """Where a save of ``target`` is written before it replaces it: beside it, hidden.

    >>> partial_path(Path("/runs/ckpt/last.ckpt"))
    PosixPath('/runs/ckpt/.last.ckpt.partial')
    """
    return target.with_name(f".{target.name}.partial")


def is_last(path: Path) -> bool:
    """A ``ModelCheckpoint`` ``save_last`` name: ``last.ckpt``, or ``last-v<n>.ckpt``.

    >>> is_last(Path("last.ckpt")), is_last(Path("last-v1.ckpt")), is_last(Path("epoch=0-step=3.ckpt"))
    (True, True, False)
    """
    return path.suffix == ".ckpt" and (path.stem == "last" or path.stem.startswith("last-v"))


def remove_path(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder, if there."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def replace_with(target: Path, write: Callable[[Path], None]) -> None:
    """``write(partial)`` a file or folder beside ``target``, then put it in ``target``'s place.

    Raises:
        OSError: the write failed; ``target`` is as it was and the partial save is removed.
    """
    partial = partial_path(target)
    remove_path(partial)  # a save killed earlier
    try:
        write(partial)
        _sync(partial)
    except BaseException as err:
        remove_path(partial)
        if not isinstance(err, Exception):  # Ctrl-C, exit: cleaned up, passed on
            raise
        raise save_failed(target, err) from err
    commit(partial, target)


def save_failed(target: Path, err: Optional[BaseException]) -> OSError:
    """The error of a save of ``target`` that failed with ``err`` (None: on another process) and was cleaned up.

    >>> str(save_failed(Path("ckpt/last.ckpt"), OSError(28, "No space left on device")))
    '[Errno 28] saving the checkpoint ckpt/last.ckpt failed (No space left on device); the previous last.ckpt is \
kept as it was, and the partial save was removed'
    """
    if err is None:
        why = "on another process"
    else:  # torch's writer reports a full disk as a RuntimeError (an iostream error): every failure reads the same
        why = err.strerror if isinstance(err, OSError) and err.strerror else f"{type(err).__name__}: {err}"
    return OSError(getattr(err, "errno", None), f"saving the checkpoint {target} failed ({why}); the previous "
                   f"{target.name} is kept as it was, and the partial save was removed")


def _sync(path: Path) -> None:
    """On disk before it replaces the previous checkpoint (every file of a folder)."""
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        with open(file, "rb") as f:
            os.fsync(f.fileno())


def commit(partial: Path, target: Path) -> None:
    """Put the complete save ``partial`` in ``target``'s place (a file: one atomic rename)."""
    if partial.is_dir() and target.is_dir() and not target.is_symlink():
        # a folder cannot be renamed over a non-empty one: the old one is moved aside first (a window of two renames)
        aside = target.with_name(f".{target.name}.old")
        remove_path(aside)
        os.rename(target, aside)
        os.rename(partial, target)
        shutil.rmtree(aside)
    elif partial.is_dir() and (target.is_symlink() or target.is_file()):
        target.unlink()
        os.rename(partial, target)
    else:
        os.replace(partial, target)


def link(target: Path, link_path: Path) -> None:
    """Make ``link_path`` a relative symbolic link to ``target``, atomically (a new link renamed over the old)."""
    fresh = link_path.with_name(f".{link_path.name}.link")
    remove_path(fresh)
    os.symlink(os.path.relpath(target, link_path.parent), fresh)
    if link_path.is_dir() and not link_path.is_symlink():
        shutil.rmtree(link_path)  # a whole sharded ``last`` folder from before: replaced once by a link
    os.replace(fresh, link_path)


class CheckpointFiles:
    """The saves of one run's checkpoints (rank zero): what was saved last, and the ``last`` links that follow it."""

    def __init__(self) -> None:
        self.newest: Optional[tuple[Path, int]] = None  # (path, global step) of the newest complete non-last save

    def links_instead(self, path: Path, step: int) -> Optional[Path]:
        """The checkpoint a ``last`` save at ``step`` should link to instead of writing (None: write it)."""
        if not is_last(path) or self.newest is None:
            return None
        saved, saved_step = self.newest
        return saved if saved_step == step and saved.parent == path.parent and saved.exists() else None

    def saved(self, path: Path, step: int) -> None:
        """``path`` is complete: remember it, and re-point the ``last`` links beside it to it."""
        if is_last(path):
            return
        self.newest = (path, step)
        for other in path.parent.glob("last*.ckpt"):
            if other.is_symlink() and is_last(other):
                link(path, other)

    def linked(self, path: Path) -> bool:
        """Whether a ``last`` link beside ``path`` points to it (it must not be removed)."""
        return any(other.is_symlink() and is_last(other) and other.resolve() == path.resolve()
                   for other in path.parent.glob("last*.ckpt") if other != path)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves replace their target atomically, with ``last`` as a link (module doc)."""

    def __init__(self) -> None:
        self.files = CheckpointFiles()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(str(path)):
            return super().save_checkpoint(checkpoint, path, storage_options)  # object stores: fsspec's own
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        step = int(checkpoint.get("global_step", -1))
        if (target := self.files.links_instead(path, step)) is not None:
            return link(target, path)
        replace_with(path, lambda partial: torch.save(checkpoint, partial))
        self.files.saved(path, step)

    def remove_checkpoint(self, path: Any) -> None:
        if not _is_local_file_protocol(str(path)):
            return super().remove_checkpoint(path)
        path = Path(path)
        if not path.is_symlink() and self.files.linked(path):
            return  # `last` points here (a link re-pointed after it would have moved it): kept
        remove_path(path)  # a link: the link only, never what it points to


def use_atomic_saves(strategy) -> None:
    """Give ``strategy`` the atomic checkpoint IO where it uses Lightning's plain ``TorchCheckpointIO`` (a user's own
    ``CheckpointIO`` plugin is left alone)."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
