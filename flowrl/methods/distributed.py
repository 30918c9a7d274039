"""The module's side of a strategy, as objects it owns: collectives over ranks (:class:`Ranks`), and the backward
passes, gradient syncs and checked optimizer steps the update components take (:func:`training_steps`), through
whatever strategy Lightning runs (one device, DDP, FSDP2, DeepSpeed).

A step whose loss or gradient norm is NaN or inf on any rank is skipped on every rank
(:class:`~flowrl.training.nonfinite.NonfiniteSteps`, :class:`CheckedStep`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from flowrl.data import data_parallel_rank
from flowrl.strategies.deepspeed import accumulating, deepspeed_engine, deepspeed_step
from flowrl.strategies.fsdp2 import forward_is_collective, is_fsdp2
from flowrl.training.nonfinite import NonfiniteSteps
from flowrl.training.rank_metrics import combine_ranks
from flowrl.training.steps import TrainingSteps


class Ranks:
    """Collectives over the ranks of ``trainer`` (call each on every rank), counting each data-parallel replica once:
    under context parallelism the ``degree`` consecutive processes of a group hold the same rows
    (:func:`~flowrl.data.data_parallel_rank`), and the gathered batch, the metrics and the sums take them from the
    group's first process (its leader) only.

    Args:
        trainer: the running trainer (its strategy, world size and rank).
        all_gather: the module's ``all_gather`` (a tensor of every rank, stacked: ``[W, ...]``).
        device: where the collectives' tensors are made.
    """

    def __init__(self, trainer, all_gather: Callable[[Tensor], Tensor], device: torch.device):
        self.trainer, self.all_gather, self.device = trainer, all_gather, device
        self.replica, self.replicas = data_parallel_rank(trainer)
        self.degree = trainer.world_size // self.replicas  # processes per replica (1 without context parallelism)
        self.leader = trainer.global_rank % self.degree == 0  # a group's processes are consecutive ranks

    def rank_sizes(self, local: int) -> list[int]:
        """Rows of every replica (one collective over every process; replicas may hold different numbers)."""
        if self.trainer.world_size == 1:
            return [local]
        sizes = self.all_gather(torch.tensor(local, device=self.device))
        return [int(s) for s in sizes.flatten().tolist()[::self.degree]]

    def gather(self, x: Tensor, sizes: list[int]) -> Tensor:
        """``x [sizes[replica], ...]`` of every replica, concatenated in replica order (padded for the collective,
        which runs over every process)."""
        if len(sizes) == 1:
            return x
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[:x.shape[0]] = x
        everyone = self.all_gather(padded)[::self.degree]  # [W, max, ...] -> each replica's leader's
        return torch.cat([everyone[r, :n] for r, n in enumerate(sizes)])

    def rank_rows(self, sizes: list[int]) -> slice:
        """This rank's rows (its replica's) of a tensor gathered with ``sizes``."""
        replica = self.replica if len(sizes) > 1 else 0
        start = sum(sizes[:replica])
        return slice(start, start + sizes[replica])

    def once(self, x: Tensor) -> Tensor:
        """``x`` on a replica's leader, zeros on the other processes of its group: what a sum over every process
        (``sync_dist``, ``reduce(..., "sum")``) counts once per replica."""
        return x if self.leader else torch.zeros_like(x)

    def global_metrics(self, metrics: dict[str, float], pairs: int, rows: int) -> dict[str, float]:
        """This rank's update ``metrics`` (means over its ``pairs`` trained pairs and ``rows`` samples) as the values of
        the whole batch (:func:`~flowrl.training.rank_metrics.combine_ranks` of the replicas; one collective). Ranks
        may return different names (a rank without pairs has no ratio), so they are gathered as objects, not
        tensors."""
        if self.trainer.world_size == 1:
            return metrics
        everyone: list = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(everyone, ({k: float(v) for k, v in metrics.items()}, pairs, rows))
        return combine_ranks(everyone[::self.degree])

    def fewest_batches(self, count: int) -> int:
        """The fewest batches any rank holds (one collective): the stop decisions until then are shared, the same
        number on every rank."""
        if self.trainer.world_size == 1:
            return count
        fewest = self.trainer.strategy.reduce(torch.tensor(float(count), device=self.device), reduce_op="min")
        return int(fewest)

    def sigterm_anywhere(self) -> bool:
        """Rank zero's SIGTERM flag, on every rank (call it on every rank). The collective is the one Lightning's
        own SIGTERM handler makes on each rank (a broadcast of one number from rank zero, as its training loop's
        ``_broadcast_sigterm_tensor``), so a handler's broadcast on one rank pairs with this one on another; an
        all-reduce here met the handler's broadcast and broke the process group. Rank zero, Lightning's launcher,
        passes the signal on to the other processes."""
        flag = torch.tensor([int(self.trainer.received_sigterm)], device=self.trainer.strategy.root_device)
        if self.trainer.world_size > 1:
            torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())


def training_steps(trainer, backward: Callable, optimizer_step: Callable,
                   parameters: Callable[[], list]) -> TrainingSteps:
    """Backward passes (``backward``: the module's ``manual_backward``), gradient syncs, the checked
    ``optimizer_step`` (:meth:`CheckedStep.step`) and collectives through ``trainer``'s strategy, as the callables the
    update components take."""
    strategy, world = trainer.strategy, trainer.world_size
    return TrainingSteps(backward=backward, optimizer_step=optimizer_step, parameters=parameters,
                         no_sync=lambda: no_sync(trainer), world_size=data_parallel_rank(trainer)[1],
                         reduce_mean=lambda x: strategy.reduce(x, reduce_op="mean") if world > 1 else x,
                         reduce_max=lambda x: strategy.reduce(x, reduce_op="max") if world > 1 else x,
                         collective_forward=forward_is_collective(strategy), sharded_gradients=is_fsdp2(strategy))


def no_sync(trainer):
    """Skip the gradient all-reduce of a non-final micro-batch (DDP, FSDP2; DeepSpeed: not an accumulation
    boundary); a no-op on one device."""
    if (engine := deepspeed_engine(trainer)) is not None:
        return accumulating(engine)
    block = getattr(trainer.strategy, "block_backward_sync", None)
    return block() if block is not None else nullcontext()


class CheckedStep:
    """The optimizer step of an update: clipped, and skipped on every rank when non-finite on any.

    Args:
        trainer: the running trainer (its strategy and global step).
        nonfinite: the module's count of skipped steps (checkpointed).
        clip: the module's ``clip_gradients`` (through the strategy and precision).
        max_grad_norm: clip to this norm (None: no clipping).
        parameters: the trained parameters (the policy's ``trainable_parameters``).
    """

    def __init__(self, trainer, nonfinite: NonfiniteSteps, clip: Callable, max_grad_norm: Optional[float],
                 parameters: Callable[[], list]):
        self.trainer, self.nonfinite, self.clip = trainer, nonfinite, clip
        self.max_grad_norm, self.parameters = max_grad_norm, parameters

    def step(self, optimizer, loss_finite: bool, parameters: Optional[list] = None,
             counted: bool = True) -> Optional[float]:
        """Clip and take the optimizer step unless the loss or the gradient norm is non-finite on any rank, then zero
        the gradients; ``counted=False`` steps through the strategy without counting a global step. Returns the
        gradient norm before clipping, or None for a skipped step."""
        trainer = self.trainer
        if not counted:
            optimizer = Uncounted(optimizer, trainer.strategy)
        on_any_rank = (lambda bad: trainer.strategy.reduce_boolean_decision(bad, all=False)) \
            if trainer.world_size > 1 else bool
        skip = lambda finite, norm: self.nonfinite.skip(finite, norm, on_any_rank, trainer.global_step)  # noqa: E731
        if (engine := deepspeed_engine(trainer)) is not None:  # its optimizer owns the gradients and clipping
            return deepspeed_step(engine, optimizer, skip, loss_finite)
        grads = [p.grad for p in (parameters or self.parameters()) if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        # FSDP2: the gradients are shards (DTensors), and so is their norm until reduced: the global norm is wanted
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if skip(loss_finite, grad_norm):
            optimizer.zero_grad()
            return None
        if self.max_grad_norm is not None:
            self.clip(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad()
        return grad_norm


class Uncounted:
    """A ``LightningOptimizer`` whose ``step`` goes through the strategy without counting as a global step."""

    def __init__(self, optimizer, strategy):
        self._optimizer, self._strategy = optimizer, strategy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def step(self) -> Any:
        return self._strategy.optimizer_step(self._optimizer.optimizer, closure=lambda: None)
