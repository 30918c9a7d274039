"""The reward set: the reward callbacks of a trainer as one object, so that a method looks them up once and every
part of it (the loop, ODE completions, calibration, evaluation) combines them the same way.

It owns the callbacks' names and weights, scoring (``score`` now, ``submit`` for scoring in the background), the
weighted total and which samples are valid (every score finite), the aggregation modes of
:mod:`flowrl.rewards.aggregate` and the sums and counts that validation reduces over ranks.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Optional, Sequence

import torch
from lightning.pytorch import Callback
from torch import Tensor

from flowrl.rewards.aggregate import aggregate, reward_tally, weighted_sum
from flowrl.rewards.base import RewardCallback, metadata_at, reward_callbacks


class RewardSet:
    """The :class:`~flowrl.rewards.base.RewardCallback` s among ``callbacks``, in order (two sharing a name are
    refused).

    >>> from flowrl.rewards.jpeg import JpegIncompressibility
    >>> rewards = RewardSet([JpegIncompressibility(weight=2.0), Callback()])  # other callbacks are not rewards
    >>> rewards.names, rewards.weights
    (['jpeg_incompressibility'], {'jpeg_incompressibility': 2.0})
    >>> rewards.total({"jpeg_incompressibility": torch.tensor([1.5, float("nan")])})
    (tensor([3., 0.]), tensor([ True, False]))
    """

    def __init__(self, callbacks: Sequence[Callback]):
        self.callbacks: list[RewardCallback] = reward_callbacks(list(callbacks))
        self.weights: dict[str, float] = {r.name: r.weight for r in self.callbacks}

    @property
    def names(self) -> list[str]:
        return list(self.weights)

    def __len__(self) -> int:
        return len(self.callbacks)

    def score(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> dict[str, Tensor]:
        """Every reward's scores ``{name: [B]}``."""
        return {r.name: r.score(images, prompts, metadata) for r in self.callbacks}

    def submit(self, images: Tensor, prompts: list[str],
               metadata: Optional[dict[str, Any]] = None) -> dict[str, Future]:
        """Start scoring with every reward (a remote one scores in the background); see :meth:`collect`."""
        return {r.name: r.submit(images, prompts, metadata) for r in self.callbacks}

    def collect(self, pending: list[dict[str, Future]]) -> dict[str, Tensor]:
        """The scores of submitted chunks, concatenated in submission order ``{name: [B]}``."""
        return {name: torch.cat([part[name].result() for part in pending]) for name in self.names}

    def total(self, scores: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The weighted raw sum ``[B]`` (0 where invalid) and validity ``[B]`` bool (every score finite)."""
        return weighted_sum(scores, self.weights)

    def total_score(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> Tensor:
        """The weighted total ``[B]`` of new images, NaN where any reward is not finite (e.g. ODE completions)."""
        total, valid = self.total(self.score(images, prompts, metadata))
        return torch.where(valid, total, torch.nan)

    def row_scorer(self, metadata: dict[str, Any], rows: int) -> Callable[[Tensor, list[str], Tensor], Tensor]:
        """``score(images [n, 3, H, W], prompts [n], row_ids [n]) -> [n]``: :meth:`total_score` of images that belong
        to rows ``row_ids`` of a batch of ``rows`` rows whose per-row ``metadata`` they see (an ODE completion is
        scored with its trajectory's source images, seed and group, as the trajectory's own image is)."""
        return lambda images, prompts, row_ids: self.total_score(images, prompts,
                                                                 metadata_at(metadata, row_ids.tolist(), rows))

    def aggregate(self, mode: str, scores: dict[str, Tensor], group_ids: Tensor, **options) -> tuple[Tensor, Tensor]:
        """The reward the estimator sees ``[B]`` (mode ``sum``, ``advantage_sum`` or ``gdpo``) and validity."""
        return aggregate(mode, scores, self.weights, group_ids, **options)

    def tally(self, scores: dict[str, Tensor]) -> dict[str, Tensor]:
        """Sums and counts of finite scores and of the valid total (they add up over batches and ranks)."""
        return reward_tally(scores, self.weights)

    def tally_keys(self) -> list[str]:
        """The keys of :meth:`tally`, in a fixed order (the same on every rank)."""
        return [f"{name}{suffix}" for name in [*self.names, "total"] for suffix in ("", "/count", "/nonfinite")]


def row_metadata(group_ids: Tensor, seeds: Tensor, cond_rows: Tensor,
                 images: Optional[list[list[Tensor]]] = None) -> dict[str, Any]:
    """What a reward sees of a rollout's rows besides their images and prompts: each row's group id and seed and,
    where prompt records carry them, its prompt's conditioning images (``images`` holds them per conditioning row, as
    the encoded prompts; a row, a tree's leaf or a completion finds its own through ``cond_rows``).

    >>> meta = row_metadata(torch.tensor([0, 0]), torch.tensor([5, 6]), torch.tensor([1, 1]), [["a"], ["b"]])
    >>> meta["images"], meta["seeds"].tolist()
    ([['b'], ['b']], [5, 6])
    """
    per_row = {"group_ids": group_ids, "seeds": seeds}
    if images is not None:
        per_row["images"] = [images[i] for i in cond_rows.tolist()]
    return batch_metadata(per_row)


def batch_metadata(batch: dict) -> dict[str, Any]:
    """What a reward sees of a batch besides its images and prompts: the rows' ``group_ids`` and ``seeds`` where the
    batch has them, and each row's prompt's conditioning ``images`` (an edit's source, a video's first frame) where
    its prompt records carry them.

    >>> batch_metadata({"prompts": ["a"], "seeds": torch.tensor([3]), "rows": 0})
    {'seeds': tensor([3])}
    """
    return {key: batch[key] for key in ("group_ids", "seeds", "images") if key in batch}
