"""Skipping optimizer steps whose loss or gradient norm is NaN or inf, and stopping a run that keeps producing them.

One decision for every rank (a rank that stepped while another skipped would leave the replicas apart), a count of
skipped steps in a row that is saved in checkpoints, and an error naming the quantity and the usual causes after
``max_in_a_row`` of them. ``skipped`` counts every skipped step, so the training loop logs a batch's
(``train/nonfinite_steps``) whatever the method's update.
"""

from __future__ import annotations

import math
from typing import Callable

from lightning.pytorch.utilities import rank_zero_warn


class NonfiniteSteps:
    """Decides, per optimizer step, whether to skip it.

    >>> guard = NonfiniteSteps(max_in_a_row=2)
    >>> guard.skip(True, 1.0), guard.skip(True, float("nan")), guard.in_a_row, guard.skipped
    (False, True, 1, 1)
    """

    def __init__(self, max_in_a_row: int):
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.skipped = 0  # every skipped step of this process's run (the loop logs each batch's share)

    def skip(self, loss_finite: bool, grad_norm: float, on_any_rank: Callable[[bool], bool] = bool,
             step: int = 0) -> bool:
        """Whether to skip this step: the loss or the gradient norm is non-finite here or (``on_any_rank``, one
        collective) on another rank. Raises after ``max_in_a_row`` skipped steps in a row.

        Raises:
            FloatingPointError: the limit is reached; names the quantity, the step and the usual causes.
        """
        bad = on_any_rank(not (loss_finite and math.isfinite(grad_norm)))
        if not bad:
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        self.skipped += 1
        if self.in_a_row >= self.max_in_a_row:
            quantity = "the loss" if not loss_finite else "the gradient norm" if not math.isfinite(grad_norm) else (
                "the loss or gradient norm on another rank")
            raise FloatingPointError(
                f"{quantity} was NaN or inf at {self.in_a_row} optimizer steps in a row (the last at global step "
                f"{step}); those steps were skipped and the weights are unchanged since the last finite one. Usual "
                "causes: a learning rate too high (model.optimizer.init_args.lr), fp16 overflow (use bf16 or 32-true "
                "precision), or a reward or noise setting that makes log-probs non-finite. Stopping "
                f"(model.max_nonfinite_steps={self.max_in_a_row}).")
        what = "loss" if not loss_finite else "gradient"
        rank_zero_warn(f"skipped optimizer step {step}: non-finite {what} ({self.in_a_row} in a row; the run stops at "
                       f"model.max_nonfinite_steps={self.max_in_a_row})")
        return True

    def state_dict(self) -> dict:
        return {"nonfinite_in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = state.get("nonfinite_in_a_row", 0)
