"""An ``evaluate`` that does not finish says so, in its folder and on its exit status.

The report folder never shows an earlier report beside images redrawn by this run: before the first model loads,
rank zero removes the report files an earlier evaluation left in ``--out`` (naming them) and writes
``INCOMPLETE``, which only a finished report removes; a killed run (even by SIGKILL) leaves the marker.

SIGTERM (a scheduler's stop-then-kill): Lightning's handler sets ``trainer.received_sigterm`` in ``predict`` too, but
its predict loop never reads it, so the run went on to its end and exited 0. :class:`StopOnSigterm` says at once
that it stops (rank zero, once); the :class:`~flowrl.evaluation.module.Evaluator` stops after the current batch (one
decision shared by every rank) and :func:`flowrl.cli.evaluate.run` exits 143, as ``fit`` does
(:class:`flowrl.callbacks.SigtermStop`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.callbacks.sigterm_stop import SigtermNotice

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


class StopOnSigterm(SigtermNotice):
    """Says at once, on rank zero, that a SIGTERM stops ``evaluate`` after the batch in progress."""

    def __init__(self, out: Any):
        super().__init__()
        self.out = out

    def notice(self, trainer) -> str:
        where = f"; {self.out} keeps its {INCOMPLETE} marker and gets no report" if self.out else ""
        return f"flowrl evaluate: SIGTERM received: stopping after the current batch{where}; exit status 143"
