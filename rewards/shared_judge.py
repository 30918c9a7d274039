"""One judge model, several rewards: a learned video judge scores a clip on several dimensions in one pass
(VideoReward: visual quality, motion quality, text alignment; VideoScore2: visual quality, text alignment, physical
consistency). Each dimension is its own reward callback, so the YAML weights it, logs it
(``train/reward/<name>``) and aggregates it (``gdpo`` normalises each one) like any reward:

    callbacks:
      - {class_path: flowrl.rewards.VideoReward, init_args: {dimension: VQ, weight: 1.0}}
      - {class_path: flowrl.rewards.VideoReward, init_args: {dimension: MQ, weight: 0.5}}

Callbacks of one class with the same ``model``, device, dtype and options (all but ``dimension``, ``name`` and
``weight``) share the loaded weights (one copy per process) and the scores of the last chunk: the reward set asks each dimension in turn for the same clips, and all but the
first get the judge's answer without running it again.
"""

from __future__ import annotations

from typing import Any, Optional
from weakref import WeakSet

import torch
from torch import Tensor

from flowrl.rewards.base import ModelReward

#: (class, model, device, dtype, options) -> the loaded judge; (class, model) -> its live callbacks; key -> the last
#: chunk's clips (the caller's tensor, not a copy), prompts, scores {dimension: [B]} and the callbacks that read them
_JUDGES: dict[tuple, Any] = {}
_USERS: dict[tuple, WeakSet] = {}
_LAST: dict[tuple, tuple[Tensor, list[str], dict[str, Tensor], WeakSet]] = {}


class SharedJudge(ModelReward):
    """A :class:`~flowrl.rewards.base.ModelReward` scoring one ``dimension`` of a judge that scores all of
    :attr:`dimensions` at once. Subclasses set ``dimensions`` and implement ``_load`` and
    ``_judge(clips [B, F, 3, H, W], prompts) -> {dimension: Tensor [B]}``."""

    takes_clips = True
    min_frames = 2  # a judge of motion: the CLI refuses it on a policy of single images before loading
    #: the dimensions the judge scores, each a valid ``dimension``
    dimensions: tuple[str, ...] = ()

    def __init__(self, model: str, dimension: str, weight: float = 1.0, name: Optional[str] = None,
                 batch_size: int = 4, device: Optional[str] = None, dtype: str = "bfloat16"):
        if dimension not in self.dimensions:
            raise ValueError(f"{type(self).__name__}: dimension={dimension!r}; choose one of {list(self.dimensions)}")
        self.dimension = dimension
        super().__init__(model, weight, name or f"{self.default_name}_{dimension.lower()}", batch_size, device, dtype,
                         frames="all")
        _USERS.setdefault((type(self), self.model_id), WeakSet()).add(self)

    #: the options that change what the judge answers (set by subclasses in ``__init__``)
    options: tuple = ()

    def _key(self, device: torch.device) -> tuple:
        return type(self), self.model_id, str(device), self.dtype, self.options

    def load(self, device=None) -> "SharedJudge":
        """The judge loaded once per (class, model, device, dtype, options) and shared by every dimension's callback."""
        device = torch.device(device or self.device or "cpu")
        key = self._key(device)
        if key not in _JUDGES:
            _JUDGES[key] = self._load(self.model_id, device, self.dtype)
        self.model, self._model_device = _JUDGES[key], device
        return self

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        key = self._key(self.model_device)
        last = _LAST.get(key)
        if not (last is not None and self not in last[3] and last[1] == list(prompts)
                and last[0].shape == images.shape and torch.equal(last[0], images)):
            _LAST[key] = last = (images, list(prompts), self._judge(images, list(prompts)), WeakSet())
        last[3].add(self)
        users = {u for u in _USERS[(type(self), self.model_id)] if (u.dtype, u.options) == (self.dtype, self.options)}
        if set(last[3]) >= users:  # every dimension has its scores: let the clips go
            _LAST.pop(key, None)
        return last[2][self.dimension].float().cpu()

    def _judge(self, clips: Tensor, prompts: list[str]) -> dict[str, Tensor]:
        raise NotImplementedError
