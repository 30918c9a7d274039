"""What every hook of the loop sees: the batch gathered from every rank, as one record.

A :class:`Batch` is a :class:`~flowrl.sampling.rollout.Rollout` of every rank's rows in rank order (their small
per-row fields: rewards, group ids, seeds, log-probs, sigmas, train masks, node ids, NFE, completion rewards; latents,
images and prompts stay on their rank) plus the credit the loop fills in from the hooks, one field at a time: the
aggregated reward and validity, the edges trained once, step rewards, advantages, loss weights and supervised
weights. It is the same on every rank, so hooks need no collective; ``rows`` are this rank's rows of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from torch import Tensor

from flowrl.sampling.rollout import Rollout

#: the per-row fields of a rollout that are gathered from every rank (latents and images stay where they are)
GATHERED = ("group_ids", "seeds", "log_probs", "sigmas", "train_mask", "completion_rewards", "node_ids", "nfe",
            "granularity")

#: what a hook returns: its tensor, or its tensor and scalar diagnostics the loop logs as ``train/<name>``
HookOutput = Union[Optional[Tensor], tuple[Optional[Tensor], dict[str, Any]]]


@dataclass
class Batch(Rollout):
    """The gathered batch (see the module docstring). Credit fields, ``[B_all]`` or ``[B_all, T]``:

    - ``total``, ``valid``: the reward the estimator sees (aggregated, 0 where invalid) and which rows have one;
    - ``trained``: the train mask with each edge shared by several leaves kept once (``Rollout.trained_once``);
    - ``step_rewards``, ``advantages``, ``loss_weights``, ``supervised_weights``: the hooks' outputs;
    - ``diagnostics``: the hooks' scalars, logged as ``train/<name>``.
    """

    rows: slice = field(default_factory=lambda: slice(0, 0))
    sizes: list[int] = field(default_factory=list)
    total: Optional[Tensor] = None
    valid: Optional[Tensor] = None
    trained: Optional[Tensor] = None
    advantages: Optional[Tensor] = None
    loss_weights: Optional[Tensor] = None
    supervised_weights: Optional[Tensor] = None
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, rollout: Rollout, **credit: Any) -> "Batch":
        """A one-process batch of ``rollout``'s rows with the ``credit`` fields given (tests and tools that call a
        hook outside the loop)."""
        fields = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(Rollout)}
        return cls(**fields, rows=slice(0, rollout.batch_size), sizes=[rollout.batch_size], **credit)

    def mine(self, x: Optional[Tensor]) -> Optional[Tensor]:
        """This rank's rows of a gathered tensor (None stays None)."""
        return None if x is None else x[self.rows]


def hook_value(out: HookOutput) -> tuple[Optional[Tensor], dict[str, Any]]:
    """A hook's tensor and its diagnostics (none when it returned the tensor alone).

    >>> import torch
    >>> hook_value(torch.ones(1)), hook_value((None, {"x": 1.0}))
    ((tensor([1.]), {}), (None, {'x': 1.0}))
    """
    if isinstance(out, tuple):
        return out[0], dict(out[1])
    return out, {}
