"""PODS (arXiv 2504.13818) for the policy-gradient methods, ``model.downsample_to: m``: every group is sampled and
scored whole, then only its ``m`` rows of largest reward variance (:func:`flowrl.advantages.max_variance_subset`)
are credited and trained, so the update runs no pass of the other rows.

The selection reads the aggregated reward of the batch gathered from every rank (the same on each, so two ranks equal
one and a resume repeats it); the rows left out are handled as rows without a valid reward while the hooks run (the
estimator sees the kept rows alone, as the paper's advantages), then keep their reward for the logged metrics.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from flowrl import advantages as adv_lib
from flowrl.advantages import outcome
from flowrl.methods.batch import Batch


def downsample_problems(method: Any) -> list[str]:
    """``model.downsample_to`` of ``method``: at least 2 (a subset of one row has no variance and no group advantage),
    on a method whose advantage is one per row (its estimator an outcome one of :mod:`flowrl.advantages.outcome`)."""
    m = method.downsample_to
    if m is None:
        return []
    name = type(method).__name__
    if method.step_credit is not None:
        return [f"model.downsample_to={m}: {name} credits {method.step_credit}, but PODS keeps whole rows by their one "
                "outcome reward; set model.downsample_to=null (or use FlowGRPO)"]
    problems = [] if m >= 2 else [f"model.downsample_to={m} must be >= 2 (a group of one row has no advantage), or "
                                  "null: train every row"]
    try:
        per_row = adv_lib.resolve(method.advantage)[0].__module__ == outcome.__name__
    except ValueError:  # an unknown estimator: the base's check names it
        per_row = True
    if not per_row:
        problems.append(f"model.downsample_to={m} keeps rows by their one outcome advantage, but model.advantage="
                        f"{method.advantage!r} gives one per (row, step); use an outcome estimator (grpo@flow_grpo, "
                        "grpo, dr_grpo, rloo, ...) or set model.downsample_to=null")
    return problems


def group_size_problems(downsample_to: Optional[int], group_size: int) -> list[str]:
    """``downsample_to`` must keep fewer rows than a group has (``data.group_size``), or it drops nothing.

    >>> group_size_problems(8, 8)[0][:60]
    'model.downsample_to=8 keeps every row of a group of data.gro'
    """
    if downsample_to is None or downsample_to < 2 or downsample_to < group_size:
        return []
    return [f"model.downsample_to={downsample_to} keeps every row of a group of data.group_size={group_size}, so it "
            f"drops nothing; set model.downsample_to below {group_size} (e.g. {max(2, group_size // 2)}) or raise "
            "data.group_size"]


def downsampled(batch: Batch, m: int, groups: Callable[[Batch], Any], hooks: Callable[[Batch], Batch]) -> Batch:
    """``hooks`` (the loop's credit) run on ``batch`` with only the max-variance ``m`` valid rows of each group
    (``groups(batch)``: the advantage's group ids) counted as valid; the others train no pair. Logs
    ``kept_rows``: the rows kept of the gathered batch."""
    valid = batch.valid
    kept = valid.clone()
    kept[valid] = adv_lib.max_variance_subset(batch.total[valid], groups(batch)[valid], m)
    credited = hooks(dataclasses.replace(batch, valid=kept))
    return dataclasses.replace(credited, valid=valid, trained=credited.trained & kept[:, None],
                               diagnostics={**credited.diagnostics, "kept_rows": float(kept.sum())})
