"""The run header's line about the run's length and its validation (``RunHeader.data_lines``), on a stand-in trainer."""

from types import SimpleNamespace

import pytest

from flowrl.callbacks import RunHeader, RunSummary


def run_line(limit_val_batches, callbacks, every=45) -> str:
    trainer = SimpleNamespace(datamodule=SimpleNamespace(val_prompts=["red 1 and blue 2"] * 3, val_samples_per_prompt=4),
                              max_steps=280, val_check_interval=every, limit_val_batches=limit_val_batches,
                              callbacks=callbacks)
    (line,) = RunHeader.data_lines(trainer, SimpleNamespace(eval_num_steps=10))
    return line


@pytest.mark.parametrize("limit, callbacks, when", [
    (1.0, [RunSummary()], "every 45 batches"),
    (0, [RunSummary()], "before the first batch and after the last"),  # the quickstart: RunSummary's two only
    (0, [RunSummary(evaluate=False)], "never (limit_val_batches 0)"),
    (0, [], "never (limit_val_batches 0)"),
])
def test_the_run_line_says_when_validation_runs(limit, callbacks, when):
    assert run_line(limit, callbacks) == (f"  run:         280 optimizer steps; validation on 3 prompts x 4 seeds "
                                          f"(10-step ODE) {when}")
