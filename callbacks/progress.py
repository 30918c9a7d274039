"""A progress bar for RL runs: optimizer steps done out of ``trainer.max_steps``, time left, and the logged reward.

Lightning's bars count batches within an epoch and show ``Epoch 0/-2`` when a run is bounded by ``max_steps``
(``max_epochs`` is then -1) and the logger version (``v_num``); neither says how far the run is. The flowrl CLI
adds this bar unless the config names a progress bar of its own or sets ``enable_progress_bar: false``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.loops.utilities import _is_max_limit_reached


def fit_stops(trainer) -> bool:
    """Whether Lightning's fit loop stops at its next check: ``_FitLoop.done`` without the line it logs ("`Trainer.fit`
    stopped: ..."), which must not start in the middle of the bar's line."""
    loop = trainer.fit_loop
    return (loop.max_batches == 0 or _is_max_limit_reached(trainer.global_step, loop.max_steps)
            or _is_max_limit_reached(loop.epoch_progress.current.processed, loop.max_epochs)
            or (trainer.should_stop and loop._can_stop_early))


def run_total(max_steps: int) -> Optional[int]:
    """The bar's total: ``max_steps`` optimizer steps, or unknown (``None``) for an unbounded run.

    >>> run_total(600), run_total(-1)
    (600, None)
    """
    return max_steps if max_steps and max_steps > 0 else None


class RunProgressBar(TQDMProgressBar):
    """One bar for the whole run, in optimizer steps (a rollout batch takes ``num_inner_epochs x num_minibatches``
    of them), with the metrics logged to the progress bar (``train/reward/total``) and no version number."""

    def on_train_start(self, trainer, *_: Any) -> None:
        # as Lightning's init_train_tqdm, with the run's total and a resumed run's start from the outset
        self.train_progress_bar = Tqdm(desc="steps", total=run_total(trainer.max_steps), initial=trainer.global_step,
                                       position=2 * self.process_position, disable=self.is_disabled, leave=True,
                                       dynamic_ncols=True, file=sys.stdout, smoothing=0, bar_format=self.BAR_FORMAT)

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        pass  # one bar across epochs: an epoch of the prompt list means nothing to a step-bounded run

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        if bar is not None and not bar.disable:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()
            if run_total(trainer.max_steps) and trainer.global_step >= trainer.max_steps:
                bar.close()  # its line ends here: Lightning's "`Trainer.fit` stopped" then starts on a line of its own

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # every way a fit ends but an error passes here before the fit loop says why it stopped: max_steps, max_epochs,
        # trainer.should_stop (max_time, early stopping, SIGTERM)
        if self._train_progress_bar is not None and fit_stops(trainer):
            self.train_progress_bar.close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        for bar in (self._train_progress_bar, self._val_progress_bar):
            if bar is not None:
                bar.close()  # the traceback starts on a line of its own

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        # "train/reward/total" is the one a user watches; the prefix costs half the line
        return {key.removeprefix("train/"): value for key, value in metrics.items()}
