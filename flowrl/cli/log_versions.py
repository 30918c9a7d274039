"""One log folder per run, shared by its loggers: ``<save_dir>/<name>/version_N`` holds the TensorBoard events,
``metrics.csv``, ``config.yaml``, the sample grids and the checkpoints of that run, and of no other.

Lightning's loggers pick ``version_N`` each on their own by scanning the folder, so a TensorBoard and a CSV logger
of one run can land in different versions, two runs started together can pick the same one, and a fixed version
(``version: csv``) makes every later run in the folder delete the earlier run's ``metrics.csv``. The CLI instead
reserves the next free version once, with an atomic ``mkdir`` (two runs started together get two versions), and
hands it to every logger of the run that shares that folder and sets no version of its own. A resumed run gets a
new version too; its ``config.yaml`` names the checkpoint it resumed from, which is how
``scripts/plot_rewards.py`` joins the runs' ``metrics.csv`` files into one history.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

#: environment variables through which launchers (Lightning, torchrun, SLURM, LSF) tell a process its rank
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def launched_as_rank_zero(environ: Optional[dict] = None) -> bool:
    """Whether this process is (or will be) global rank zero, from the launcher's environment alone (before any
    process group exists). A second node started by hand has ``NODE_RANK=1`` and ``LOCAL_RANK=0``.

    >>> launched_as_rank_zero({}), launched_as_rank_zero({"NODE_RANK": "1", "LOCAL_RANK": "0"})
    (True, False)
    """
    environ = os.environ if environ is None else environ
    return all(environ.get(name, "0") in ("", "0") for name in RANK_VARIABLES)


def existing_versions(root: Path) -> list[int]:
    """The ``N`` of every ``version_N`` folder in ``root`` (empty if ``root`` does not exist)."""
    if not root.is_dir():
        return []
    return [int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := re.fullmatch(r"version_(\d+)", p.name))]


def reserve_version(root: Path) -> int:
    """Create ``root/version_N`` for the smallest ``N`` above every existing version and return ``N``; ``mkdir``
    either creates the folder or fails, so two processes never reserve the same one.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp()); (root / "version_4").mkdir()
    >>> reserve_version(root), reserve_version(root), sorted(existing_versions(root))
    (5, 6, [4, 5, 6])
    """
    root.mkdir(parents=True, exist_ok=True)
    version = max(existing_versions(root), default=-1) + 1
    while True:
        try:
            (root / f"version_{version}").mkdir()
            RESERVED.append(root / f"version_{version}")
            return version
        except FileExistsError:
            version += 1


#: the version folders this process reserved (a run that stops before writing into one gives it back)
RESERVED: list[Path] = []


def release_unused() -> list[Path]:
    """Remove the version folders this process reserved and never wrote into (a run stopped by a configuration error
    before it started), so the next run takes their number. Returns the removed folders.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp()); used = reserve_version(root); unused = reserve_version(root)
    >>> (root / f"version_{used}" / "metrics.csv").touch(); [p.name for p in release_unused()], existing_versions(root)
    (['version_1'], [0])
    """
    removed = []
    while RESERVED:
        folder = RESERVED.pop()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            removed.append(folder)
    return removed


def link_latest(log_dir: Path) -> None:
    """Point ``<save_dir>/<name>/latest`` at this run's ``version_N``, so that ``runs/<name>/latest/checkpoints/
    last.ckpt`` always names the newest run's checkpoint (replaced atomically; skipped where links cannot be made)."""
    link, temporary = log_dir.parent / "latest", log_dir.parent / f".latest-{os.getpid()}"
    try:
        temporary.symlink_to(log_dir.name, target_is_directory=True)
        os.replace(temporary, link)
    except OSError:  # a filesystem without symbolic links: the version folders still work
        temporary.unlink(missing_ok=True)


def _init_args(logger: Any) -> Optional[Any]:
    init_args = logger.get("init_args") if hasattr(logger, "get") else None
    return init_args if init_args is not None and hasattr(init_args, "get") else None


def share_log_versions(loggers: Any, rank_zero: bool = True) -> dict[tuple[str, str], int]:
    """Give the parsed logger configs (``trainer.logger``: a list or one ``{class_path, init_args}``) that write to
    the same ``save_dir/name`` and set no ``version`` one reserved version (set in place). Other ranks only read
    the next free version: their loggers never write (the trainer broadcasts rank zero's folder), so they must not
    reserve one. Returns ``{(save_dir, name): version}``."""
    chosen: dict[tuple[str, str], int] = {}
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init_args = _init_args(logger)
        if init_args is None or "version" not in init_args or init_args.get("version") is not None:
            continue
        key = (str(init_args.get("save_dir")), str(init_args.get("name") or ""))
        if key not in chosen:
            root = Path(key[0]) / key[1]
            chosen[key] = reserve_version(root) if rank_zero else max(existing_versions(root), default=-1) + 1
        init_args["version"] = chosen[key]
    return chosen


def log_roots(trainer: Any) -> list[Path]:
    """The ``save_dir/name`` folders the parsed ``trainer`` config's loggers keep their ``version_N`` runs in
    (Lightning's default logger: ``default_root_dir/lightning_logs``).

    >>> [p.as_posix() for p in log_roots({"default_root_dir": "runs", "logger": [{"class_path": "x", "init_args":
    ...     {"save_dir": "runs", "name": "tiny"}}, {"class_path": "y", "init_args": {"save_dir": "out"}}]})]
    ['runs/tiny', 'out/lightning_logs']
    """
    loggers = trainer.get("logger")
    if loggers is None or loggers is True:
        return [Path(str(trainer.get("default_root_dir") or ".")) / "lightning_logs"]
    roots = []
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init_args = _init_args(logger)
        if init_args is not None and init_args.get("save_dir") is not None:
            name = init_args.get("name", "lightning_logs")
            roots.append(Path(str(init_args["save_dir"])).expanduser() / str(name or ""))
    return list(dict.fromkeys(roots))
