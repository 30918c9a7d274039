"""What an update needs from the training loop, as plain callables: backward passes through the strategy, the gradient
sync of a micro-batch, the checked optimizer step and the collectives over ranks.

The update components (:mod:`flowrl.training.ppo_update`, :mod:`flowrl.training.adapter_steps`) take a
:class:`TrainingSteps` and nothing else of the training loop, so they run without a LightningModule: a method builds
one from its trainer and strategy (:meth:`flowrl.methods.base.BaseModule.training_steps`), a test builds one with
:func:`plain_steps` from a bare list of parameters.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import Tensor, nn


def _same(x: Tensor) -> Tensor:
    return x


@dataclass
class TrainingSteps:
    """The training loop's side of an update.

    Attributes:
        backward: ``loss -> None``, the backward pass through the strategy (precision plugin, DDP/FSDP hooks).
        optimizer_step: ``(optimizer, loss_finite, parameters=None, counted=True) -> grad norm | None``: clip and step
            unless the loss or the gradient norm is non-finite on any rank (then skipped: None), then zero the
            gradients; ``counted=False`` keeps the run's global step where it is (an auxiliary adapter's step).
        parameters: ``(adapter=None) -> [Parameter]``, the trained parameters (of one adapter).
        no_sync: a context in which backward passes do not sync gradients (a non-final micro-batch).
        world_size: data-parallel replicas: the processes, or the context-parallel groups (whose processes train
            the same rows, each its share of the tokens).
        reduce_mean, reduce_max: a tensor averaged / maximised over every rank (one collective each).
        collective_forward: each forward of the denoiser is a collective (FSDP2 or ZeRO-3 on several processes), so
            every rank must run as many.
        sharded_gradients: gradients are reduce-scattered inside each backward (FSDP2), not all-reduced by the caller.
    """

    backward: Callable[[Tensor], None]
    optimizer_step: Callable[..., Optional[float]]
    parameters: Callable[..., list[nn.Parameter]]
    no_sync: Callable[[], ContextManager] = nullcontext
    world_size: int = 1
    reduce_mean: Callable[[Tensor], Tensor] = _same
    reduce_max: Callable[[Tensor], Tensor] = _same
    collective_forward: bool = False
    sharded_gradients: bool = False

    def zero_backward(self) -> None:
        """A backward of zero through every trained parameter: a rank with nothing to train in a minibatch still joins
        its gradient sync."""
        self.backward(sum(p.sum() for p in self.parameters()) * 0.0)


def plain_steps(parameters: list[nn.Parameter], max_grad_norm: Optional[float] = None) -> TrainingSteps:
    """One process, no strategy: ``loss.backward()``, clip to ``max_grad_norm``, ``optimizer.step()``; a step whose
    loss or gradient norm is non-finite is skipped.

    >>> w = nn.Parameter(torch.ones(2)); opt = torch.optim.SGD([w], lr=0.5); steps = plain_steps([w])
    >>> steps.backward((w ** 2).sum()); steps.optimizer_step(opt, True), w.tolist()  # grad 2 each: norm 2 sqrt 2
    (2.8284270763397217, [0.0, 0.0])
    """

    def step(optimizer: Any, loss_finite: bool, params: Optional[list] = None, counted: bool = True) -> Optional[float]:
        grads = [p.grad for p in (params or parameters) if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        if not (loss_finite and math.isfinite(norm)):
            optimizer.zero_grad()
            return None
        if max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params or parameters, max_grad_norm, torch.tensor(norm))
        optimizer.step()
        optimizer.zero_grad()
        return norm

    return TrainingSteps(backward=lambda loss: loss.backward(), optimizer_step=step,
                         parameters=lambda adapter=None: list(parameters))
