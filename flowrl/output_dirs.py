"""Every folder a run will write to, checked for writing before the first rollout: a read-only or impossible
checkpoint folder otherwise fails at the first save, which is hours into an SD3.5 run."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional


def unwritable(folder: str, keep: bool = True) -> Optional[str]:
    """Why ``folder`` cannot take a new file (``None`` if it can), creating it if missing. A real write, not
    ``os.access``: that says yes to root on a read-only mount and no on some network filesystems that accept
    writes. ``keep=False``: the folders the check made are removed again (a command that may still be rejected for
    another reason leaves nothing behind).

    >>> unwritable(tempfile.mkdtemp()) is None
    True
    >>> file = tempfile.mkstemp()[1]; unwritable(str(Path(file) / "sub")).split(":")[0]
    'NotADirectoryError'
    >>> base = Path(tempfile.mkdtemp()); unwritable(str(base / "a" / "b"), keep=False), list(base.iterdir())
    (None, [])
    """
    path = Path(folder).expanduser()
    made = [p for p in (path, *path.parents) if not p.exists() and not p.is_symlink()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".flowrl-write-check-"):
            pass
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    finally:
        for p in made if not keep else []:
            try:
                p.rmdir()
            except OSError:  # not made here after all (another process's), or not empty: left as it is
                break
    return None


def output_dirs(trainer, rank_zero: bool) -> dict[str, str]:
    """``{folder: the setting that chose it}`` for the folders this rank writes to: every checkpoint callback's
    ``dirpath`` (already resolved by its ``setup``) and, on rank zero, every logger's folder."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    folders = {}
    if rank_zero:
        for logger in trainer.loggers:
            folder = getattr(logger, "log_dir", None) or logger.save_dir
            if folder:
                folders[str(folder)] = f"{type(logger).__name__} save_dir (trainer.default_root_dir in the configs)"
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            folders[str(callback.dirpath)] = "ModelCheckpoint dirpath (trainer.callbacks)"
    return folders


def output_dir_problems(trainer, rank_zero: bool) -> list[str]:
    """One line per output folder of this rank that cannot be written, naming the setting and the fix."""
    return [f"cannot write to {folder} ({why}), set by {setting}: pick a writable folder, e.g. "
            "--trainer.default_root_dir=<folder>"
            for folder, setting in output_dirs(trainer, rank_zero).items() if (why := unwritable(folder))]
