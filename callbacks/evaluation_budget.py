"""Stop a run once it has spent a budget of model evaluations: the unit methods are compared at.

A method's evaluations per batch can change during a run (Dynamic-TreeRPO's window moves to cheaper steps,
DenseGRPO's first batch carries its calibration), so a budget cannot always be turned into ``max_steps`` up front.
This callback adds up ``rollout/evaluations`` (the batch's evaluations over every rank, logged by every method)
after each batch and stops the fit at the first batch that reaches ``max_evaluations``; the count is in the
checkpoint, so a resumed run stops where the uninterrupted one would.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback


class EvaluationBudget(Callback):
    """Args:
        max_evaluations: stop after the batch with which the run's model evaluations reach this many.
    """

    def __init__(self, max_evaluations: float):
        if not max_evaluations > 0:
            raise ValueError(f"EvaluationBudget: max_evaluations={max_evaluations} must be > 0")
        self.max_evaluations, self.spent = float(max_evaluations), 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        evaluations = trainer.callback_metrics.get("rollout/evaluations")
        if evaluations is None:
            raise RuntimeError("EvaluationBudget needs the method to log rollout/evaluations (every flowrl method does)")
        self.spent += float(evaluations)  # the same on every rank (a synced sum), so every rank stops together
        if self.spent >= self.max_evaluations:
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"spent": self.spent}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.spent = float(state_dict.get("spent", 0.0))
