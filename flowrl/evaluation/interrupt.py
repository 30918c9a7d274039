"""An ``evaluate`` that does not finish says so, in its folder and on its exit status.

The report folder never shows an earlier report beside images redrawn by this run: before the first model loads,
rank zero removes the report files an earlier evaluation left in ``--out`` (naming them) and writes
``INCOMPLETE``, which only a finished report removes; a killed run (even by SIGKILL) leaves the marker.

SIGTERM (a scheduler's stop-then-kill): Lightning's handler sets ``trainer.received_sigterm`` in ``predict`` too, but
its predict loop never reads it, so the run went on to its end and exited 0. :class:`StopOnSigterm` says at once
that it stops (rank zero, once); the :class:`~flowrl.evaluation.module.Evaluator` stops after the current batch (one
decision shared by every rank) and :func:`flowrl.evaluation.command.run` exits 143, as ``fit`` does
(:class:`flowrl.callbacks.SigtermStop`).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

INCOMPLETE = "INCOMPLETE"
#: what :func:`flowrl.evaluation.report.write_report` writes (the images are redrawn under ``images/``)
REPORT_FILES = ("report.md", "report.html", "scores.csv", "diversity.csv", "summary.csv", "evaluation.json",
                "chart.png", "grid.png")


def mark_incomplete(out: Path, command: str) -> list[Path]:
    """Removes an earlier evaluation's report files from ``out`` and writes the ``INCOMPLETE`` marker; returns the
    files removed."""
    out.mkdir(parents=True, exist_ok=True)
    removed = [out / name for name in REPORT_FILES if (out / name).is_file()]
    for path in removed:
        path.unlink()
    (out / INCOMPLETE).write_text(f"This evaluation has not finished: its images may be partly drawn, and there is no "
                                  f"report. It was started by:\n  {command}\nRun it again to finish the folder.\n")
    return removed


def mark_complete(out: Path) -> None:
    (out / INCOMPLETE).unlink(missing_ok=True)


class StopOnSigterm(Callback):
    """Says at once, on rank zero, that a SIGTERM stops ``evaluate`` after the batch in progress."""

    def __init__(self, out: Any):
        self.out, self.trainer, self.previous, self.announced = out, None, None, False

    def setup(self, trainer, pl_module, stage: str) -> None:
        # before Lightning registers its own handler (in its run, after setup), which then calls this one too
        self.trainer, self.previous = trainer, signal.signal(signal.SIGTERM, self._on_sigterm)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.restore()

    def restore(self) -> None:
        """Puts back the handler found at setup (also after an exception, when no ``teardown`` hook runs)."""
        if self.previous is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self.previous)
        self.previous = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.announced or self.trainer is None or not self.trainer.is_global_zero:
            return
        self.announced = True
        where = f"; {self.out} keeps its {INCOMPLETE} marker and gets no report" if self.out else ""
        line = f"\nflowrl evaluate: SIGTERM received: stopping after the current batch{where}; exit status 143\n"
        os.write(sys.stdout.fileno(), line.encode())  # not print: a handler may interrupt a print to this stream

