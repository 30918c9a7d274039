"""What a checkpoint path given on the command line names, checked before anything loads: a checkpoint file, a
sharded checkpoint folder, or a run's folder (``runs/<name>/version_N`` or its ``checkpoints/``), whose ``last.ckpt``
(else its newest checkpoint) is meant; and the ``config.yaml`` LightningCLI saved beside the run."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Optional

from flowrl.checkpoints.sharded import is_sharded_checkpoint

EXAMPLE = "runs/<name>/version_N/checkpoints/last.ckpt"


def run_checkpoint(path: Path) -> Optional[Path]:
    """The checkpoint a run folder (or its ``checkpoints/`` folder) means: its ``last.ckpt``, else its newest
    ``*.ckpt``; None when ``path`` is not such a folder."""
    if not path.is_dir() or is_sharded_checkpoint(path):
        return None
    for folder in (path / "checkpoints", path):
        if (folder / "last.ckpt").exists():
            return folder / "last.ckpt"
    found = [p for folder in (path / "checkpoints", path) if folder.is_dir() for p in folder.glob("*.ckpt")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def newest_run_checkpoint(roots: list[Path]) -> Optional[Path]:
    """The checkpoint of the newest ``version_N`` under any of ``roots`` (a logger's ``save_dir/name``) that holds
    one (:func:`run_checkpoint`); None when none does. What ``--ckpt_path last`` means: Lightning itself looks only in
    the new run's own (empty) version folder.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp()); (root / "version_0/checkpoints").mkdir(parents=True)
    >>> (root / "version_0/checkpoints/last.ckpt").touch(); (root / "version_1").mkdir()
    >>> newest_run_checkpoint([root]).relative_to(root).as_posix()
    'version_0/checkpoints/last.ckpt'
    """
    found = []
    for root in roots:
        versions = [p for p in root.glob("version_*") if p.is_dir() and p.name[len("version_"):].isdigit()]
        for folder in sorted(versions, key=lambda p: int(p.name[len("version_"):]), reverse=True):
            if (ckpt := run_checkpoint(folder)) is not None:
                found.append(ckpt)
                break
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """``path``, or the checkpoint of the run folder it names (:func:`run_checkpoint`)."""
    path = Path(path).expanduser()
    return run_checkpoint(path) or path


def checkpoint_problems(path: str) -> list[str]:
    """A checkpoint path that cannot be a checkpoint: missing, empty, a folder with none, or a file that is not a
    ``torch.save`` zip (Lightning's special values ``last``/``best``/``hpc``/``registry``, run folders and sharded
    checkpoint folders pass).

    >>> checkpoint_problems("/no/such.ckpt")  # doctest: +ELLIPSIS
    ["ckpt_path='/no/such.ckpt' does not exist; ..."]
    """
    if path in ("last", "best", "hpc", "registry") or path.startswith("registry:"):
        return []
    file = resolve_checkpoint(path)
    if not file.exists():
        return [f"ckpt_path={path!r} does not exist; pass an existing .ckpt (e.g. {EXAMPLE}), a run's folder or the "
                "folder of a sharded one (FSDP2), or leave it out"]
    fix = "pass an earlier step's checkpoint from the same folder, or leave ckpt_path out"
    if file.is_dir() and not is_sharded_checkpoint(file):
        return [f"ckpt_path={path!r} is a folder without a checkpoint (no last.ckpt or *.ckpt in it or its "
                f"checkpoints/, and no meta.pt of a sharded one); pass a .ckpt, e.g. {EXAMPLE}"]
    if file.is_file() and file.stat().st_size == 0:
        return [f"ckpt_path={path!r} is empty (0 bytes: a save that was cut off); {fix}"]
    if file.is_file() and not zipfile.is_zipfile(file):
        return [f"ckpt_path={path!r} is not a complete checkpoint (not a torch.save zip archive: truncated or "
                f"another kind of file); {fix}"]
    return []


def run_config(ckpt: Path) -> Optional[Path]:
    """The ``config.yaml`` LightningCLI saved for the run of checkpoint ``ckpt`` (its folder or the one above)."""
    for folder in (ckpt.parent, ckpt.parent.parent):
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None
