"""Optimizer steps of named LoRA adapters for the likelihood-free methods (TDM-R1, DiffusionNFT): one optimizer per
trained adapter, a gradient all-reduce per adapter, steps that need not count as Lightning global steps, and frozen
adapters that trail trained ones.

Every backward runs without DDP's gradient sync (``steps.no_sync()``) and each adapter's gradients are averaged over
the ranks once, just before its step (one collective, the same on every rank). DDP's own reducer expects a gradient
for every trainable parameter at each synced backward, which a loss that trains one adapter of three never gives.
Under FSDP2 (``fsdp2``) each backward reduce-scatters the gradients it produced instead, as the shards' gradients
must be (one collective per micro-batch rather than per step); the adapters are sharded with the blocks they sit in.
An auxiliary adapter's step (TDM-R1's fake score and surrogate reward) runs through the strategy (precision plugin,
``on_before_optimizer_step`` hooks) but does not count as a global step, so ``trainer.max_steps``, checkpoints and EMA
count the generator's steps, one per batch.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from flowrl.policies.base import FlowPolicy, adapter_of
from flowrl.training.steps import TrainingSteps


def adapter_optimizers(factory: Callable, policy: FlowPolicy, adapters: list[str],
                       overrides: Optional[dict[str, dict[str, Any]]] = None) -> list[torch.optim.Optimizer]:
    """One optimizer per adapter from ``factory``; ``overrides[name]`` sets that adapter's options (``lr``, ``betas``,
    ``weight_decay``, ...) through a torch param group."""
    overrides = overrides or {}
    return [factory([{"params": policy.trainable_parameters(name), **overrides.get(name, {})}]) for name in adapters]


def backward(steps: TrainingSteps, loss: Tensor) -> None:
    """``loss.backward()`` through the strategy, without a gradient sync (see :func:`reduce_gradients`); under FSDP2
    with it: each backward reduce-scatters (averages) the gradients it produced, those of the adapter it trains."""
    if steps.sharded_gradients:  # FSDP2 keeps gradients it did not reduce unsharded, out of reach of a later all-reduce
        steps.backward(loss)
        return
    with steps.no_sync():
        steps.backward(loss)


@torch.no_grad()
def reduce_gradients(steps: TrainingSteps, params: list[nn.Parameter]) -> None:
    """Average the gradients of ``params`` over the ranks (one all-reduce); a missing gradient counts as zero.
    Under FSDP2 the backward did it."""
    if steps.world_size == 1 or not params or steps.sharded_gradients:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = steps.reduce_mean(torch.cat([g.flatten() for g in grads]))
    for p, g in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = g.view_as(p).clone()


def adapter_step(steps: TrainingSteps, optimizer, params: list[nn.Parameter], loss_finite: bool,
                 counted: bool = True) -> Optional[float]:
    """Average ``params``' gradients over the ranks, then the checked, clipped optimizer step; ``counted=False``
    keeps the run's global step where it is. Returns the gradient norm before clipping, or None for a skipped
    (non-finite) step."""
    reduce_gradients(steps, params)
    return steps.optimizer_step(optimizer, loss_finite, params, counted)


@torch.no_grad()
def follow(policy: FlowPolicy, follower: str, leader: str, decay: float) -> None:
    """``follower <- decay follower + (1 - decay) leader``, parameter by parameter (decay 0: a copy). A frozen
    adapter trailing a trained one: TDM-R1's ``surrogate_old``, DiffusionNFT's ``old``."""
    params = {name: [p for n, p in policy.denoiser.named_parameters() if adapter_of(n) == name]
              for name in (follower, leader)}
    torch._foreach_lerp_(params[follower], params[leader], 1.0 - decay)
