"""``python -m flowrl ARGS`` as a fork of pytest's process: a process of its own (its own environment, process group,
exit status and output) that starts with the imports pytest's process made, where a launched interpreter spends ~10
CPU-s on them. For commands whose processes the tests start themselves (a node of a multi-node run); a command that
launches its own ranks (``--trainer.devices=2``) re-runs its command line, which a fork does not have: launch it."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], env: dict[str, str], log: str) -> None:
    """The forked process: ``env`` set, stdout and stderr into ``log`` (one stream), ``main(args)`` run from the
    repository, then the exit status a launched command would have (the process ends here, running no handler of
    pytest's)."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
    os.chdir(ROOT)
    code = 0
    try:
        from flowrl.cli import main

        main(args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001  a launched command's traceback and status 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    os._exit(code)


class ForkedCommand:
    """``python -m flowrl ARGS`` with ``env`` added to this process's environment, forked now; what
    ``subprocess.Popen`` gives a test of it (``communicate``, ``kill``, ``returncode``), its output kept in ``log``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.args, self.log = args, Path(log)
        self.process = multiprocessing.get_context("fork").Process(target=run, args=(args, env, str(log)))
        self.process.start()

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """The output (stdout and stderr, one stream) once the process ended; ``TimeoutExpired`` if it did not within
        ``timeout`` seconds."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.log.read_text(), None

    def kill(self) -> None:
        self.process.kill()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode
