"""One rule for every method: a batch trains at least one (sample, step) pair.

Before loading, :func:`untrained_problems` asks the method for the steps a batch trains from its options alone
(``trained_step_mask``, on a placeholder schedule) and rejects options for which there are none, naming the
options that cause it: each option set away from its default whose default alone would train something. At run
time :class:`UntrainedBatches` counts batches in which no pair is left to train (every trained step masked out,
weighted 0, or given a non-finite advantage): they take no optimizer step, the count in a row is logged
(``train/untrained_batches``), and ``max_untrained_batches`` of them in a row stop the run with an error, so a run
never goes on training nothing in silence.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from flowrl.config_nodes import declared_options

_NOT_OPTIONS = ("policy", "optimizer")  # built objects, never the cause of a step mask


def placeholder_sigmas(num_steps: int) -> Tensor:
    """``[T+1]`` the schedule the checks before loading assume: ``linspace(1, 0, T + 1)`` (the policy's own is only
    known once it loads; it differs in spacing, not in which steps move or land on 0).

    >>> placeholder_sigmas(4).tolist()
    [1.0, 0.75, 0.5, 0.25, 0.0]
    """
    return torch.linspace(1, 0, num_steps + 1)


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value)


def _steps(method: Any, key: Optional[str] = None, value: Any = None) -> int:
    """Steps a batch of ``method`` trains, with option ``key`` set to ``value`` where given (on a copy: the method's
    other attributes shared, none changed)."""
    if key is not None:
        clone = object.__new__(type(method))
        clone.__dict__.update(method.__dict__)
        clone.__dict__[key] = value
        method = clone
    return int(method.trained_step_mask().sum())


def untrained_problems(method: Any) -> list[str]:
    """``[problem]`` when a batch of ``method`` trains no (sample, step) pair, naming the options that cause it (each
    option is the attribute of its name; its declared default is the fix tried); ``[]`` otherwise. Run after every
    other check has passed (the mask is computed from options already known to be sound)."""
    if _steps(method):
        return []
    defaults = {k: v for k, v in declared_options(type(method)).items() if k not in _NOT_OPTIONS}
    changed = {k: getattr(method, k) for k, d in defaults.items() if getattr(method, k) != d}
    fixes = []
    for key, value in changed.items():
        try:
            steps = _steps(method, key, defaults[key])
        except Exception:  # noqa: BLE001  a default that does not fit the other options: not the fix
            continue
        if steps:
            fixes.append((key, value, defaults[key], steps))
    shown = fixes or [(k, v, defaults[k], 0) for k, v in changed.items()]
    num_steps = method.num_steps
    named = ", ".join(f"model.{k}={_yaml(v)}" for k, v, _, _ in shown) or f"model.num_steps={num_steps}"
    line = (f"{named}: a {type(method).__name__} batch trains no (sample, step) pair (0 of its {num_steps} steps carry "
            "a trained transition), so the run would take optimizer steps that change nothing")
    if fixes:
        line += "; " + "; ".join(f"model.{k}={_yaml(d)} (its default) would train {n}" for k, _, d, n in fixes)
    return [line]


def trained_pairs(trained: Tensor, valid: Tensor, loss_weights: Tensor, advantages: Tensor) -> tuple[int, str]:
    """Pairs of a gathered batch that can change the weights (trained, of a row with a valid reward, weighted
    non-zero, with a finite advantage; ``[B, T]`` masks and values, ``valid [B]``), and why there are none.

    >>> t = torch.tensor([[True, False], [True, True]])
    >>> trained_pairs(t, torch.tensor([True, True]), torch.ones(2, 2), torch.tensor([[0.5, 1], [float("nan"), 1]]))
    (2, '')
    >>> trained_pairs(t, torch.tensor([True, True]), torch.ones(2, 2), torch.full((2, 2), float("nan")))
    (0, 'every advantage of a trained pair is NaN or inf')
    """
    candidates = trained & valid[:, None]
    usable = candidates & (loss_weights != 0) & torch.isfinite(advantages)
    if usable.any():
        return int(usable.sum()), ""
    if not candidates.any():
        return 0, "no step of a row with a valid reward is trained"
    if not torch.isfinite(advantages[candidates]).any():
        return 0, "every advantage of a trained pair is NaN or inf"
    return 0, "every trained pair has loss weight 0"


class UntrainedBatches:
    """Counts batches in a row that train nothing; raises after ``max_in_a_row`` of them.

    >>> guard = UntrainedBatches(max_in_a_row=2)
    >>> guard.skip(5, step=0), guard.in_a_row
    (False, 0)
    """

    def __init__(self, max_in_a_row: int):
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0

    def skip(self, pairs: int, step: int, why: str = "") -> bool:
        """Whether to skip this batch's update (it has no pair to train; the same decision on every rank, as the
        gathered batch is).

        Raises:
            RuntimeError: ``max_in_a_row`` batches in a row trained nothing.
        """
        if pairs:
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        if self.in_a_row >= self.max_in_a_row:
            raise RuntimeError(
                f"{self.in_a_row} batches in a row trained no (sample, step) pair (the last at global step {step}"
                f"{': ' + why if why else ''}); no optimizer step was taken for them. Usual causes: every "
                "advantage non-finite (a reward or an estimator option), every trained step weighted 0 by a method "
                "hook, or a schedule on which no step is stochastic. Stopping "
                f"(model.max_untrained_batches={self.max_in_a_row}).")
        rank_zero_warn(f"batch at global step {step} trained no (sample, step) pair{': ' + why if why else ''}; "
                       f"no optimizer step ({self.in_a_row} in a row; the run stops at "
                       f"model.max_untrained_batches={self.max_in_a_row})")
        return True

    def state_dict(self) -> dict:
        return {"untrained_in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = state.get("untrained_in_a_row", 0)
