"""Prompt data and the group sampler that spreads GRPO groups over ranks.

Each training batch holds ``num_groups`` prompts with ``group_size`` samples each across the *global* batch: the
images the reward scores per prompt, for every method. A batch row is a rollout, one seed: a trajectory (one sample)
or a tree (its leaves are the samples), so a prompt gets ``group_size / samples_per_rollout`` rows. Group ids are
global integers from the sampler (``batch counter * num_groups + g``), never hashes of prompt text, and every row
carries its own seed. A batch is a pure function of ``(seed, epoch, index, rank, world_size)``, which is what makes
resuming exact. The rank and world are the data-parallel ones (:func:`data_parallel_rank`): under context
parallelism the processes of one group are one replica and draw the same rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from flowrl.prompt_records import RecordImages, source_images


def load_prompts(source: Union[str, list[str]]) -> list[str]:
    """Prompts from an inline list, a ``.txt`` file (one per line) or a ``.jsonl`` file (``{"prompt": ...}``)."""
    if isinstance(source, (list, tuple)):
        prompts = [str(p) for p in source]
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {source!r} does not exist; give a .txt/.jsonl path or a list")
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if path.suffix == ".jsonl":
            prompts = [json.loads(line)["prompt"] for line in lines]
        elif path.suffix == ".txt":
            prompts = lines
        else:
            raise ValueError(f"prompt file {source!r}: unsupported suffix {path.suffix!r}; use .txt or .jsonl")
    if not prompts:
        raise ValueError(f"no prompts found in {source!r}; a training run needs at least one prompt")
    return prompts


def data_parallel_rank(trainer) -> tuple[int, int]:
    """``(replica, replicas)`` of ``trainer`` (None: ``(0, 1)``): Lightning's data-parallel rank and world
    (``trainer.distributed_sampler_kwargs``), every process under DDP or FSDP2, one per context-parallel group
    under context parallelism (its processes split one clip, so they share a batch)."""
    kwargs = getattr(trainer, "distributed_sampler_kwargs", None)
    if kwargs:
        return int(kwargs["rank"]), int(kwargs["num_replicas"])
    return getattr(trainer, "global_rank", 0), getattr(trainer, "world_size", 1)  # one device (or a stand-in)


@dataclass(frozen=True)
class GroupLayout:
    """Batch geometry: ``num_groups`` prompts x ``group_size`` samples per global batch over ``world_size`` ranks,
    in rollouts of ``samples_per_rollout`` samples (1: trajectories; a tree's leaves). ``spread``: shuffle the global
    batch's rollouts before splitting them over ranks (as Flow-GRPO), else whole groups stay on one rank."""

    num_prompts: int
    num_groups: int
    group_size: int
    world_size: int = 1
    spread: bool = True
    seed: int = 0
    samples_per_rollout: int = 1

    def problems(self, min_group_size: int = 2, method: str = "the method") -> list[str]:
        """Problems with the geometry, each naming the fix; ``min_group_size`` is the method's.

        >>> GroupLayout(10, 4, 8, samples_per_rollout=16).problems(1, "TreeRPO")  # doctest: +ELLIPSIS
        ['data.group_size=8 is not a multiple of the 16 samples one TreeRPO rollout scores ...']
        """
        out = []
        per = self.samples_per_rollout
        if self.group_size < min_group_size:
            out.append(f"data.group_size={self.group_size}: group advantages need at least {min_group_size} samples "
                       "per prompt")
        if self.group_size % per:
            fits = ", ".join(str(per * k) for k in range(1, 4))
            out.append(f"data.group_size={self.group_size} is not a multiple of the {per} samples one {method} "
                       f"rollout scores (the leaves of its tree): data.group_size counts samples per prompt for every "
                       f"method; use {fits}, ... (1, 2, 3 trees per prompt), or a smaller tree")
            return out
        if self.num_groups < 1:
            out.append(f"data.num_groups={self.num_groups}: need at least one prompt per batch")
        total = self.num_groups * self.rollouts_per_group
        if self.spread and total % self.world_size:
            out.append(f"the batch's {total} rollouts (data.num_groups x data.group_size / {per}) are not divisible "
                       f"by the {self.world_size} ranks; change data.num_groups or data.group_size")
        if not self.spread and self.num_groups % self.world_size:
            out.append(f"data.num_groups={self.num_groups} is not divisible by the {self.world_size} ranks "
                       "(data.spread_groups=false keeps whole groups on a rank)")
        return out

    @property
    def rollouts_per_group(self) -> int:
        """Rollouts (seeds) per prompt: trajectories, or trees."""
        return self.group_size // self.samples_per_rollout

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(self.num_prompts / self.num_groups)

    @property
    def local_batch_size(self) -> int:
        """Rollouts (batch rows) per rank."""
        return self.num_groups * self.rollouts_per_group // self.world_size


def group_batch(layout: GroupLayout, epoch: int, index: int, rank: int) -> dict[str, torch.Tensor]:
    """The rows of batch ``index`` of ``epoch`` that belong to ``rank``.

    Returns:
        ``prompt_ids``, ``group_ids``, ``seeds``: ``[local_batch_size]`` long.

    >>> lay = GroupLayout(num_prompts=3, num_groups=2, group_size=2, world_size=2, spread=False)
    >>> group_batch(lay, 0, 0, rank=1)["group_ids"].tolist()
    [1, 1]
    """
    gen = torch.Generator().manual_seed(layout.seed * 1_000_003 + epoch)
    order = torch.randperm(layout.num_prompts, generator=gen)
    counter = epoch * layout.batches_per_epoch + index
    picks = torch.arange(index * layout.num_groups, (index + 1) * layout.num_groups) % layout.num_prompts
    per = layout.rollouts_per_group
    prompt_ids = order[picks].repeat_interleave(per)  # [G * n]
    group_ids = (counter * layout.num_groups + torch.arange(layout.num_groups)).repeat_interleave(per)
    total = prompt_ids.numel()
    seeds = layout.seed * 1_000_003 + 7_919 * (counter * total + torch.arange(total))
    if layout.spread:
        perm = torch.randperm(total, generator=torch.Generator().manual_seed(layout.seed + 31 * counter + 1))
        prompt_ids, group_ids, seeds = prompt_ids[perm], group_ids[perm], seeds[perm]
    n = layout.local_batch_size
    part = slice(rank * n, (rank + 1) * n)
    return {"prompt_ids": prompt_ids[part], "group_ids": group_ids[part], "seeds": seeds[part]}


def eval_batches(prompts: list[str], samples_per_prompt: int, batch_size: int, first_seed: int, rank: int = 0,
                 world_size: int = 1) -> list[dict]:
    """This rank's evaluation batches: row ``r = j * len(prompts) + i`` is sample ``j`` of prompt ``i`` with seed
    ``first_seed + r`` (so the first sample of each prompt keeps its seed whatever ``samples_per_prompt``); rank
    ``k`` takes the rows ``r % world_size == k``.

    >>> [(b["prompts"], b["seeds"].tolist()) for b in eval_batches(["a", "b"], 2, 3, 100)]
    [(['a', 'b', 'a'], [100, 101, 102]), (['b'], [103])]
    >>> eval_batches(["a", "b"], 2, 3, 100, rank=1, world_size=2)[0]["prompts"]
    ['b', 'b']
    """
    rows = list(range(rank, len(prompts) * samples_per_prompt, world_size))  # each rank a disjoint share
    return [{"prompts": [prompts[r % len(prompts)] for r in rows[s:s + batch_size]],
             "seeds": torch.tensor(rows[s:s + batch_size]) + first_seed,
             "prompt_ids": torch.tensor(rows[s:s + batch_size]) % len(prompts)}
            for s in range(0, len(rows), batch_size)]


def predict_rows(prompts: list[str], seeds: list[int]) -> list[dict]:
    """Every prompt with every seed, prompt-major: row ``r = i * len(seeds) + j`` is prompt ``i`` with seed
    ``seeds[j]``, so a grid with ``len(seeds)`` columns shows one prompt per row.

    >>> predict_rows(["a", "b"], [0, 7])[1:3]
    [{'prompt': 'a', 'seed': 7, 'row': 1}, {'prompt': 'b', 'seed': 0, 'row': 2}]
    """
    return [{"prompt": prompt, "seed": seed, "row": i * len(seeds) + j}
            for i, prompt in enumerate(prompts) for j, seed in enumerate(seeds)]


def collate_rows(rows: list[dict]) -> dict:
    """Rows of :func:`predict_rows` as one batch: ``prompts`` (list), ``seeds [B]`` and ``rows [B]`` (long)."""
    return {"prompts": [r["prompt"] for r in rows], "seeds": torch.tensor([r["seed"] for r in rows]),
            "rows": torch.tensor([r["row"] for r in rows])}


class GroupBatchLoader:
    """An iterable of per-rank batch dicts (``prompts``, ``prompt_ids``, ``group_ids``, ``seeds``) with
    ``state_dict``/``load_state_dict`` so Lightning resumes it anywhere.

    Its position is the number of batches the training step has *processed* over the whole run, read from
    ``consumed()`` (the trainer's total batch progress): Lightning's fetcher reads one batch ahead except at the end
    of a sized epoch, so the count of batches handed out cannot tell the two apart. Each ``iter()`` continues from
    that position to the end of its epoch (``divmod(position, batches_per_epoch)``), whatever Lightning counts as
    the epoch: a checkpoint written when a run ends (``max_steps`` reached on an epoch's last batch) restores
    Lightning's per-epoch batch counter unreset, so Lightning cuts the next epoch short, and a loader that followed
    Lightning's epoch and per-epoch count would skip the rest of that epoch's batches (a resumed run then differed
    from one run in one go from its second batch on).
    """

    def __init__(self, prompts: list[str], layout: GroupLayout, rank: int,
                 consumed: Optional[Callable[[], int]] = None, images: Optional[RecordImages] = None):
        self.prompts, self.layout, self.rank, self.images = prompts, layout, rank, images
        self.consumed = consumed or (lambda: self._handed_out)
        self._handed_out, self._resume_at = 0, None

    def __len__(self) -> int:
        return self.layout.batches_per_epoch

    def __iter__(self) -> Iterator[dict]:
        position = self.consumed() if self._resume_at is None else self._resume_at
        self._resume_at, self._handed_out = None, position
        epoch, start = divmod(position, len(self))
        for index in range(start, len(self)):
            batch = group_batch(self.layout, epoch, index, self.rank)
            batch["prompts"] = [self.prompts[i] for i in batch["prompt_ids"].tolist()]
            if self.images is not None:  # prompt records with images: one list per row
                batch["images"] = self.images(batch["prompt_ids"].tolist())
            self._handed_out += 1
            yield batch

    def state_dict(self) -> dict:
        return {"position": int(self.consumed())}

    def load_state_dict(self, state: dict) -> None:
        # checkpoints before the run-wide position saved Lightning's epoch and the batches processed within it
        self._resume_at = state["position"] if "position" in state else state["epoch"] * len(self) + state["consumed"]


class EvalLoader:
    """Fixed evaluation batches as *one* loader (Lightning reads a bare list as several dataloaders)."""

    def __init__(self, batches: list[dict], images: Optional[RecordImages] = None):
        self.batches, self.images = batches, images

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[dict]:
        if self.images is None:
            return iter(self.batches)
        return ({**b, "images": self.images(b["prompt_ids"].tolist())} for b in self.batches)  # read when used


class PromptDataModule(LightningDataModule):
    """Training prompts in GRPO groups and fixed-seed evaluation prompts.

    Args:
        prompts: inline list, ``.txt`` or ``.jsonl`` path.
        val_prompts: the same forms; evaluated with the deterministic ODE sampler from fixed seeds.
        group_size: samples per prompt (``G``). num_groups: prompts per global batch.
        spread_groups: shuffle a group's samples over ranks (Flow-GRPO) or keep each group on one rank.
        val_batch_size: evaluation samples per batch. val_samples_per_prompt: samples (fixed seeds) per evaluation
            prompt, as GenEval's 4 per prompt; more of them make the mean less noisy. val_limit: validate on the
            first this many validation prompts only (a quick check; None: all of them).
        seed: seeds the prompt order and every sample's noise.
        predict_prompts: prompts for ``python -m flowrl predict`` (a list, ``.txt`` or ``.jsonl``; None: the
            validation prompts). predict_seeds: the seeds each of them is drawn with (None: 0, 1, 2, 3).
    """

    def __init__(self, prompts: Union[str, list[str]], val_prompts: Optional[Union[str, list[str]]] = None,
                 group_size: int = 8, num_groups: int = 4, spread_groups: bool = True, val_batch_size: int = 16,
                 val_samples_per_prompt: int = 1, val_limit: Optional[int] = None, seed: int = 0,
                 predict_prompts: Optional[Union[str, list[str]]] = None, predict_seeds: Optional[list[int]] = None):
        super().__init__()
        self.predict_source, self.predict_seeds = predict_prompts, list(predict_seeds or [0, 1, 2, 3])
        self.prompt_source, self.val_source = prompts, val_prompts
        self.group_size, self.num_groups, self.spread_groups = group_size, num_groups, spread_groups
        self.val_batch_size, self.val_samples_per_prompt, self.seed = val_batch_size, val_samples_per_prompt, seed
        self.val_limit = val_limit
        problems = GroupLayout(1, num_groups, group_size, 1, spread_groups, seed).problems(min_group_size=1)
        problems += [f"data.{key}={value}: need at least 1" for key, value in (
            ("val_samples_per_prompt", val_samples_per_prompt), ("val_limit", val_limit)) if value is not None and value < 1]
        if problems:
            raise ValueError("invalid data settings:\n  " + "\n  ".join(problems))

    def setup(self, stage: str) -> None:
        if stage == "predict":  # the training prompts may not be there (another folder, an exported run)
            source = self.predict_source if self.predict_source is not None else self.val_source
            if source is None:
                raise ValueError("predict needs prompts: set data.predict_prompts (python -m flowrl predict "
                                 "--prompts ... or --prompt_file FILE) or data.val_prompts")
            self.predict_prompts = load_prompts(source)
            self.predict_images = source_images(source, "data.predict_prompts", self.trainer)
            return
        self.prompts = load_prompts(self.prompt_source)
        self.val_prompts = load_prompts(self.val_source)[:self.val_limit] if self.val_source is not None else []
        self.train_images = source_images(self.prompt_source, "data.prompts", self.trainer)  # None: prompts only
        self.val_images = source_images(self.val_source, "data.val_prompts", self.trainer)
        world = data_parallel_rank(self.trainer)[1]
        method = self.trainer.lightning_module if self.trainer else None
        per = method.rollout_cost()[0] if hasattr(method, "rollout_cost") else 1  # a tree's leaves
        self.layout = GroupLayout(len(self.prompts), self.num_groups, self.group_size, world,
                                  self.spread_groups, self.seed, per)
        if problems := self.layout.problems(getattr(method, "min_group_size", 2), type(method).__name__):
            raise ValueError("invalid data settings:\n  " + "\n  ".join(problems))

    def train_dataloader(self) -> GroupBatchLoader:
        if self.trainer is None:
            return GroupBatchLoader(self.prompts, self.layout, 0, images=self.train_images)
        progress = self.trainer.fit_loop.epoch_loop.batch_progress.total  # over the run, not the epoch
        return GroupBatchLoader(self.prompts, self.layout, data_parallel_rank(self.trainer)[0],
                                lambda: progress.processed, self.train_images)

    def val_dataloader(self) -> EvalLoader:
        rank, world = data_parallel_rank(self.trainer)
        return EvalLoader(eval_batches(self.val_prompts, self.val_samples_per_prompt, self.val_batch_size,
                                       10_000 * (self.seed + 1), rank, world), getattr(self, "val_images", None))

    def predict_dataloader(self) -> DataLoader:
        # a DataLoader (not a plain iterable) so that Lightning tracks the rows each batch holds for prediction writers
        images = getattr(self, "predict_images", None)  # row r of predict_rows: prompt r // len(predict_seeds)
        collate = collate_rows if images is None else images.collating(collate_rows, len(self.predict_seeds))
        return DataLoader(predict_rows(self.predict_prompts, self.predict_seeds), batch_size=self.val_batch_size,
                          shuffle=False, collate_fn=collate)
