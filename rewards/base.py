"""The reward-callback contract: a Lightning callback with a ``name``, a ``weight`` and ``score``.

``score(images [B, 3, H, W] in [0, 1], prompts [B], metadata) -> Tensor [B]``. A method finds every
:class:`RewardCallback` on ``trainer.callbacks``, scores each rollout with all of them, logs each, and sums the
weighted scores; swapping a reward is a config edit. Scoring runs in chunks of ``batch_size`` images under
``torch.no_grad()``; ``metadata`` values with one entry per row (tensors ``[B, ...]``, lists of ``B``) are cut to
each chunk's rows, other values pass whole. Models load in ``setup`` on the trainer's device.

Video: ``score`` also takes clips ``[B, F, 3, H, W]``. An image reward scores the frames its ``frames`` option picks
(default: first, middle and last) as images, each with its row's prompt and metadata, and reduces each clip's frame
scores with ``frame_reduction`` (default: the mean; see :mod:`flowrl.rewards.video_frames`). A reward whose
``takes_clips`` is true scores whole clips instead: its ``_score`` gets ``[B, F, 3, H, W]`` (images as one-frame
clips).

On any other LightningModule, a reward callback scores what ``validation_step`` returns when that is a dict with
``images`` ``[B, 3, H, W]`` in ``[0, 1]`` and ``prompts`` (optionally ``metadata``), and logs the epoch mean as
``val/<name>`` (a torchmetrics ``MeanMetric``, synced over ranks). Modules that score rewards themselves (flowrl's
methods) set ``scores_own_rewards = True`` and are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch import Callback
from torch import Tensor

from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec, frame_indices, frames_problem, reduce_frames


class RewardOutputError(ValueError):
    """A reward's scorer returned something other than one number per image: a fault of the reward, not of the
    images or prompts it was given (the reward server answers it with 500, not 400)."""


def to_scores(value: Any, count: int, who: str) -> Tensor:
    """``value`` as float32 scores ``[count]``: a tensor, NumPy array or list of ``count`` real numbers (NaN marks an
    image the reward could not score). Anything else raises :class:`RewardOutputError` naming ``who``, what it
    returned and what it must return.

    >>> to_scores([1, 2.5], 2, "reward 'r'")
    tensor([1.0000, 2.5000])
    >>> try:
    ...     to_scores("high", 1, "reward 'r'")
    ... except RewardOutputError as err:
    ...     print(err)  # doctest: +ELLIPSIS
    reward 'r' returned a str ('high'); it must return a tensor, a NumPy array or a list of 1 floats ...
    """
    must = (f"it must return a tensor, a NumPy array or a list of {count} floats (finite, or NaN for an image it "
            f"cannot score)")
    if torch.is_tensor(value):
        scores = value.detach()
    elif isinstance(value, (str, bytes, Mapping)) or value is None:
        raise RewardOutputError(f"{who} returned {_describe(value)}; {must}")
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as err:  # ragged nesting, objects NumPy cannot hold
            raise RewardOutputError(f"{who} returned {_describe(value)} ({err}); {must}") from err
        if array.dtype.kind not in "biuf":  # strings, objects, complex numbers
            raise RewardOutputError(f"{who} returned {_describe(value)}; {must}")
        scores = torch.from_numpy(array.astype(np.float64))
    if not (scores.is_floating_point() or scores.dtype in (torch.bool, *_INT_DTYPES)):  # complex, ...
        raise RewardOutputError(f"{who} returned a {scores.dtype} tensor; {must}")
    if scores.shape != (count,):
        raise RewardOutputError(f"{who} returned shape {tuple(scores.shape)} for {count} images; {must}")
    return scores.float()


_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _describe(value: Any) -> str:
    """``a list of str (['a', 'b'])``: the type of a value, of its items for a list or tuple, and a short repr."""
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, (list, tuple)) and value:
        kinds = sorted({type(v).__name__ for v in value})
        return f"a {type(value).__name__} of {' and '.join(kinds)} ({text})"
    return f"{'an' if type(value).__name__[0] in 'aeiou' else 'a'} {type(value).__name__} ({text})"


class RewardCallback(Callback):
    """Base class. Subclasses implement ``_score`` on one chunk; ``score`` chunks, checks shapes and gathers.

    Args:
        weight: multiplies this reward in the total. name: the key in logs (default: the class's ``default_name``).
        batch_size: images scored per chunk (a clip's scored frames count as images).
        frames: the frames of a video it scores (``first_middle_last``, ``all``, ``first``, ``middle``, ``last``,
            ``every_<k>`` or a list of indices). frame_reduction: ``mean`` or ``min`` of a clip's frame scores.
    """

    default_name = "reward"
    #: whether ``_score`` takes whole clips ``[B, F, 3, H, W]`` (a temporal reward) rather than images
    takes_clips = False

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: a reward needs at least 1 image per chunk")
        self.weight, self.name, self.batch_size = float(weight), name or self.default_name, batch_size
        if problem := frames_problem(frames, frame_reduction):
            raise ValueError(f"reward {self.name!r}: {problem}")
        self.frames, self.frame_reduction = frames, frame_reduction

    @classmethod
    def config_problems(cls, init_args: dict[str, Any]) -> list[str]:
        """Problems of this reward's parsed ``init_args`` that the CLI reports with the config's other problems,
        before any callback or weight is built (none by default; ``FunctionReward``: a path that does not import)."""
        return []

    @property
    def state_key(self) -> str:
        return f"{type(self).__name__}[name={self.name}]"

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> Tensor:
        """Scores ``[B]`` (float32, on ``images.device``) for images ``[B, 3, H, W]`` or clips ``[B, F, 3, H, W]``
        in ``[0, 1]`` (see the module docstring for clips).

        Raises ``ValueError`` for images or prompts of the wrong shape (the caller's fault) and
        :class:`RewardOutputError` when ``_score`` returns anything but one real number per image (the reward's)."""
        if images.ndim not in (4, 5) or images.shape[-3] != 3 or len(prompts) != images.shape[0]:
            raise ValueError(f"reward {self.name!r}: expected images [B, 3, H, W] or clips [B, F, 3, H, W] and B "
                             f"prompts; got {tuple(images.shape)} and {len(prompts)} prompts")
        metadata, batch = metadata or {}, len(prompts)
        if self.takes_clips and images.ndim == 4:
            images = images[:, None]  # an image is a one-frame clip
        picked = frame_indices(self.frames, images.shape[1]) if images.ndim == 5 and not self.takes_clips else None
        rows = self.batch_size if picked is None else max(1, self.batch_size // len(picked))
        who = f"reward {self.name!r} ({type(self).__name__})"
        out = []
        for s in range(0, batch, rows):
            part, chunk = slice(s, s + rows), prompts[s:s + rows]
            meta = metadata_rows(metadata, part, batch)
            if picked is None:
                out.append(to_scores(self._score(images[part], chunk, meta), len(chunk), who).to(images.device))
                continue
            k = len(picked)  # each clip's picked frames as images, with its prompt and metadata repeated
            frames = images[part][:, picked].flatten(0, 1)
            scores = to_scores(self._score(frames, [p for p in chunk for _ in range(k)],
                                           metadata_rows(meta, slice(None), len(chunk), repeat=k)), len(chunk) * k, who)
            out.append(reduce_frames(scores.view(len(chunk), k), self.frame_reduction).to(images.device))
        return torch.cat(out)

    def submit(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> Future:
        """Start scoring and return a ``Future`` of the scores ``[B]``. The loop submits each sampling chunk as
        soon as its images exist; this default scores now, a remote reward overrides it to score in the background
        while the next chunk is sampled."""
        future: Future = Future()
        future.set_result(self.score(images, prompts, metadata))
        return future

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        raise NotImplementedError

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._val_mean = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """Score ``outputs["images"]`` / ``outputs["prompts"]`` of a module's ``validation_step``."""
        if getattr(pl_module, "scores_own_rewards", False) or not isinstance(outputs, Mapping) or not {
                "images", "prompts"} <= set(outputs):
            return
        from torchmetrics import MeanMetric

        if getattr(self, "_val_mean", None) is None:
            self._val_mean = MeanMetric(nan_strategy="ignore").to(pl_module.device)
        scores = self.score(outputs["images"], list(outputs["prompts"]), outputs.get("metadata"))
        self._val_mean.update(scores.masked_fill(~torch.isfinite(scores), torch.nan))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if getattr(self, "_val_mean", None) is not None:
            pl_module.log(f"val/{self.name}", self._val_mean.compute())
            self._val_mean = None


class ModelReward(RewardCallback):
    """A reward backed by weights: loads once, in ``setup``, on the trainer's device or a device of its own.

    Subclasses implement ``_load(path, device, dtype) -> model`` and ``_score``; ``self.model`` holds the result.

    Args:
        model: a hub id, a local folder, or ``flowrl/<name>`` for the embedded assets.
        device: where the scorer runs (default: the LightningModule's device).
        dtype: ``float32``, ``bfloat16`` or ``float16``: the dtype the scorer's weights and inputs use.
    """

    def __init__(self, model: str, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 device: Optional[str] = None, dtype: str = "float32", frames: FrameSpec = DEFAULT_FRAMES,
                 frame_reduction: str = "mean"):
        super().__init__(weight, name, batch_size, frames, frame_reduction)
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"reward {self.name!r}: dtype={dtype!r}; choose float32, bfloat16 or float16")
        self.model_id, self.device, self.dtype = model, device, getattr(torch, dtype)
        self.model = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.load(self.device or pl_module.device)

    def load(self, device=None) -> "ModelReward":
        """Loads the weights (once) and moves them to ``device``; returns ``self`` for chaining."""
        device = torch.device(device or self.device or "cpu")
        if self.model is None:
            self.model = self._load(self.model_id, device, self.dtype)
        else:
            self.model.to(device)
        self._model_device = device
        return self

    @property
    def model_device(self) -> torch.device:
        if self.model is None:
            self.load()
        return self._model_device

    def _load(self, model: str, device: torch.device, dtype: torch.dtype):
        raise NotImplementedError


def metadata_rows(metadata: dict[str, Any], rows: slice, batch: int, repeat: int = 1) -> dict[str, Any]:
    """The ``rows`` of every per-row value of ``metadata`` (a tensor with ``batch`` rows, a list or tuple of
    ``batch`` items), each row ``repeat`` times in a row (a clip's frames scored as images); other values whole.

    >>> metadata_rows({"seeds": torch.arange(4), "images": [[1], [2], [3], [4]], "scale": 2.0}, slice(2, 4), 4)
    {'seeds': tensor([2, 3]), 'images': [[3], [4]], 'scale': 2.0}
    >>> metadata_rows({"seeds": torch.tensor([5, 6]), "scale": 2.0}, slice(None), 2, repeat=2)
    {'seeds': tensor([5, 5, 6, 6]), 'scale': 2.0}
    """
    def cut(value):
        if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == batch:
            return value[rows].repeat_interleave(repeat, dim=0)
        if isinstance(value, (list, tuple)) and len(value) == batch:
            return [v for v in value[rows] for _ in range(repeat)]
        return value

    return {key: cut(value) for key, value in metadata.items()}


def metadata_at(metadata: dict[str, Any], index: list[int], batch: int) -> dict[str, Any]:
    """The rows ``index`` (in that order, repeats allowed) of every per-row value of ``metadata`` (a tensor with
    ``batch`` rows, a list or tuple of ``batch`` items); other values whole.

    >>> metadata_at({"seeds": torch.arange(3), "images": [[1], [2], [3]], "scale": 2.0}, [2, 2, 0], 3)
    {'seeds': tensor([2, 2, 0]), 'images': [[3], [3], [1]], 'scale': 2.0}
    """
    def pick(value):
        if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == batch:
            return value[torch.as_tensor(index, dtype=torch.long, device=value.device)]
        if isinstance(value, (list, tuple)) and len(value) == batch:
            return [value[i] for i in index]
        return value

    return {key: pick(value) for key, value in metadata.items()}


def reward_callbacks(callbacks: list[Callback]) -> list[RewardCallback]:
    """The reward callbacks among ``callbacks``, in order; raises if two share a name."""
    rewards = [c for c in callbacks if isinstance(c, RewardCallback)]
    names = [r.name for r in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"two reward callbacks share a name in {names}; set `name` on one of them")
    return rewards
