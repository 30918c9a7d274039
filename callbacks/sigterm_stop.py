"""SIGTERM (a scheduler's preemption, ``kill``) during ``fit``: say so at once, stop at the next safe point, save a
checkpoint there and print the run summary; the process then exits 143 (:func:`flowrl.cli.main`).

Lightning does the stopping: its SIGTERM handler sets ``trainer.received_sigterm``, and the training loop raises
``SIGTERMException`` once the current batch (its rollout and every optimizer step of it) has finished, on every rank
(a validation in progress stops at its next batch). What it leaves out is what a person sees: it logs nothing a user
reads until then (a batch can take minutes), a ``ModelCheckpoint`` saves on the exception only with
``save_on_exception: true`` (no shipped config sets it), and ``on_fit_end``, where the summary is printed, is never
called. This callback adds those, through Lightning's own hooks: a handler beside Lightning's that prints one line
(rank 0, once), and ``on_exception``, which saves through the run's own ``ModelCheckpoint`` callbacks (their
``on_exception``, so the file is written as every save of the run is, atomically with ``last`` re-pointed) and then
prints the :class:`~flowrl.callbacks.RunSummary` without the closing validation (a preemption's grace period is short).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional

from lightning.pytorch import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException


class SigtermNotice(Callback):
    """A SIGTERM handler beside Lightning's that says once, on rank zero, what the stop will do: installed at
    ``setup`` of the stages in ``stages`` (None: any), before Lightning registers its own (which then calls this one
    too), and put back at ``teardown``. Subclasses say what in :meth:`notice`."""

    stages: Optional[tuple[str, ...]] = None

    def __init__(self) -> None:
        self.trainer: Any = None
        self.announced = False
        self.previous: Any = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if (self.stages is None or stage in self.stages) and self.previous is None:
            self.trainer, self.announced = trainer, False
            self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.restore()

    def restore(self) -> None:
        """Puts back the handler found at setup, once Lightning's teardown has put back this one (the one it found).
        After an exception no ``teardown`` hook runs: the command calls this when it ends."""
        if self.previous is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self.previous)
        self.previous = None

    def notice(self, trainer) -> str:
        raise NotImplementedError

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        trainer = self.trainer
        if self.announced or trainer is None or not trainer.is_global_zero:
            return
        self.announced = True
        # os.write, not print: a signal handler may run in the middle of a print to the same stream
        os.write(sys.stdout.fileno(), f"\n{self.notice(trainer)}\n".encode())


class SigtermStop(SigtermNotice):
    """Announces a SIGTERM once and saves a checkpoint and the summary when Lightning stops for it (``fit`` only;
    :class:`flowrl.cli.FlowRLCLI` adds it to every ``fit``)."""

    stages = ("fit",)

    def notice(self, trainer) -> str:
        dirs = sorted({str(c.dirpath) for c in trainer.checkpoint_callbacks if c.dirpath})
        where = f" to {', '.join(dirs)}" if dirs else ""
        # at step 0 (the validation before training) ModelCheckpoint saves nothing: there is nothing to resume
        save = (f"saving a checkpoint{where}" if trainer.global_step else "saving no checkpoint (nothing is trained "
                "yet)")
        return (f"flowrl: SIGTERM received: stopping after the current batch (at global step {trainer.global_step} "
                f"now), then {save} and printing the run summary; the process exits with status 143")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        for ckpt in trainer.checkpoint_callbacks:  # Lightning calls these after every other callback's on_exception
            ckpt.save_on_exception = True
            ckpt.on_exception(trainer, pl_module, exception)  # skipped where this step is saved already
        step, saved = trainer.global_step, self.checkpoint(trainer)
        summaries = [c for c in trainer.callbacks if hasattr(c, "print_summary")]
        for summary in summaries:
            summary.print_summary(trainer, stopped=f"stopped by SIGTERM at global step {step}", checkpoint=saved)
        if not summaries and trainer.is_global_zero:
            print(f"flowrl: stopped by SIGTERM at global step {step}; "
                  f"{f'resume with --ckpt_path {saved}' if saved else 'no checkpoint saved'}", flush=True)

    @staticmethod
    def checkpoint(trainer) -> Optional[str]:
        """The checkpoint a resume should take: the run's ``last``, else the newest in a checkpoint folder (the file
        ``on_exception`` saves is neither a ``last`` nor a top-k one)."""
        for ckpt in trainer.checkpoint_callbacks:
            if ckpt.last_model_path:
                return ckpt.last_model_path
        found = [p for c in trainer.checkpoint_callbacks if c.dirpath and Path(c.dirpath).is_dir()
                 for p in Path(c.dirpath).glob("*.ckpt")]
        return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None
