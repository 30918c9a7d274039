"""The module's side of a strategy: collectives over ranks, backward passes, gradient syncs and the checked optimizer
step, through whatever strategy Lightning runs (one device, DDP, FSDP2, DeepSpeed).

:class:`Distributed` sits between :class:`~flowrl.methods.generation.Generation` and the loop
(:class:`~flowrl.methods.base.BaseModule`): it gathers per-rank rows of any size, and hands the update components a
:class:`~flowrl.training.steps.TrainingSteps` (:meth:`Distributed.training_steps`), the only way they reach the
strategy. A step whose loss or gradient norm is NaN or inf on any rank is skipped on every rank
(:class:`~flowrl.training.nonfinite.NonfiniteSteps`, ``self.nonfinite``).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Optional

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from flowrl.methods.generation import Generation
from flowrl.strategies.deepspeed import accumulating, deepspeed_engine, deepspeed_step
from flowrl.strategies.fsdp2 import forward_is_collective, is_fsdp2
from flowrl.training.rank_metrics import combine_ranks
from flowrl.training.steps import TrainingSteps


class Distributed(Generation):
    """Collectives and optimizer steps of a method (see the module docstring); not a method by itself."""

    # -- ranks ---------------------------------------------------------------------------------------------

    def rank_sizes(self, local: int) -> list[int]:
        """Rows on every rank (one collective; ranks may hold different numbers)."""
        if self.trainer.world_size == 1:
            return [local]
        sizes = self.all_gather(torch.tensor(local, device=self.device))
        return [int(s) for s in sizes.flatten().tolist()]

    def gather(self, x: Tensor, sizes: list[int]) -> Tensor:
        """``x [sizes[rank], ...]`` of every rank, concatenated in rank order (padded for the collective)."""
        if len(sizes) == 1:
            return x
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[:x.shape[0]] = x
        everyone = self.all_gather(padded)  # [W, max, ...]
        return torch.cat([everyone[r, :n] for r, n in enumerate(sizes)])

    def rank_rows(self, sizes: list[int]) -> slice:
        """This rank's rows of a tensor gathered with ``sizes``."""
        rank = self.trainer.global_rank if len(sizes) > 1 else 0
        start = sum(sizes[:rank])
        return slice(start, start + sizes[rank])

    def global_metrics(self, metrics: dict[str, float], pairs: int, rows: int) -> dict[str, float]:
        """This rank's update ``metrics`` (means over its ``pairs`` trained pairs and ``rows`` samples) as the values of
        the whole batch (:func:`~flowrl.training.rank_metrics.combine_ranks`; one collective). Ranks may return
        different names (a rank without pairs has no ratio), so they are gathered as objects, not tensors."""
        if self.trainer.world_size == 1:
            return metrics
        everyone: list = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(everyone, ({k: float(v) for k, v in metrics.items()}, pairs, rows))
        return combine_ranks(everyone)

    # -- the training loop's side of an update -------------------------------------------------------------

    def training_steps(self) -> TrainingSteps:
        """Backward passes, gradient syncs, checked optimizer steps and collectives through this trainer's strategy,
        as the callables the update components take."""
        strategy, world = self.trainer.strategy, self.trainer.world_size
        return TrainingSteps(backward=self.manual_backward, optimizer_step=self.finite_optimizer_step,
                             parameters=self.policy.trainable_parameters, no_sync=self.no_sync, world_size=world,
                             reduce_mean=lambda x: strategy.reduce(x, reduce_op="mean") if world > 1 else x,
                             reduce_max=lambda x: strategy.reduce(x, reduce_op="max") if world > 1 else x,
                             collective_forward=forward_is_collective(strategy), sharded_gradients=is_fsdp2(strategy))

    def no_sync(self):
        """Skip the gradient all-reduce of a non-final micro-batch (DDP, FSDP2; DeepSpeed: not an accumulation
        boundary); a no-op on one device."""
        if (engine := deepspeed_engine(self.trainer)) is not None:
            return accumulating(engine)
        block = getattr(self.trainer.strategy, "block_backward_sync", None)
        return block() if block is not None else nullcontext()

    def finite_optimizer_step(self, optimizer, loss_finite: bool, parameters: Optional[list] = None,
                              counted: bool = True) -> Optional[float]:
        """Clip and take the optimizer step unless the loss or the gradient norm is non-finite on any rank, then zero
        the gradients; ``counted=False`` steps through the strategy without counting a global step. Returns the
        gradient norm before clipping, or None for a skipped step."""
        if not counted:
            optimizer = Uncounted(optimizer, self.trainer.strategy)
        on_any_rank = (lambda bad: self.trainer.strategy.reduce_boolean_decision(bad, all=False)) \
            if self.trainer.world_size > 1 else bool
        skip = lambda finite, norm: self.nonfinite.skip(finite, norm, on_any_rank, self.global_step)  # noqa: E731
        if (engine := deepspeed_engine(self.trainer)) is not None:  # its optimizer owns the gradients and clipping
            return deepspeed_step(engine, optimizer, skip, loss_finite)
        grads = [p.grad for p in (parameters or self.policy.trainable_parameters()) if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        # FSDP2: the gradients are shards (DTensors), and so is their norm until reduced: the global norm is wanted
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if skip(loss_finite, grad_norm):
            optimizer.zero_grad()
            return None
        if self.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
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
