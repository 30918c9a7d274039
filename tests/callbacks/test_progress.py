"""The run's progress bar ends its line however a fit ends, before Lightning says why it stopped ("`Trainer.fit`
stopped: ..."), so that line never starts in the middle of the bar's; and an error's traceback too."""

import logging

import pytest
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from flowrl.callbacks import RunProgressBar


class StopAt(Callback):
    """Sets ``trainer.should_stop`` (as max_time, early stopping or a SIGTERM do) after global step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class FailAt(Callback):
    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step >= 2:
            raise RuntimeError("a failure mid-run")


class BarAtStop(logging.Handler):
    """Whether the bar was open when Lightning logged the fit loop's "stopped" line."""

    def __init__(self, bar: RunProgressBar):
        super().__init__(logging.DEBUG)
        self.bar, self.open_at_stop = bar, []

    def emit(self, record):
        if record.getMessage().startswith("`Trainer.fit` stopped"):
            self.open_at_stop.append(not self.bar.train_progress_bar.disable)  # tqdm's close() disables it


@pytest.mark.parametrize("limits, callbacks", [
    ({"max_steps": 3}, []),
    ({"max_epochs": 1, "limit_train_batches": 3}, []),  # `max_epochs=1` reached: no max_steps
    ({"max_steps": 10}, [StopAt(2)]),  # `trainer.should_stop` (logged at debug level)
])
def test_the_bar_is_closed_before_the_fit_loop_says_it_stopped(tmp_path, limits, callbacks):
    bar = RunProgressBar()
    handler, logger = BarAtStop(bar), logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        Trainer(default_root_dir=tmp_path, accelerator="cpu", logger=False, enable_checkpointing=False,
                enable_model_summary=False, limit_val_batches=0, callbacks=[bar, *callbacks],
                **limits).fit(BoringModel())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert handler.open_at_stop == [False]


def test_an_error_mid_run_closes_the_bar(tmp_path):
    bar = RunProgressBar()
    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_model_summary=False, limit_val_batches=0, max_steps=10, callbacks=[bar, FailAt()])
    with pytest.raises(RuntimeError, match="a failure mid-run"):
        trainer.fit(BoringModel())
    assert bar.train_progress_bar.disable  # closed: the traceback starts on a line of its own
