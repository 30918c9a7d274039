"""DeepSpeed's side of the loop's gradient accumulation and optimizer step (``--trainer.strategy=deepspeed_stage_2``
or ``deepspeed_stage_3``, CUDA only, ``pip install 'flowrl[deepspeed]'``).

Lightning wraps the module in a ``DeepSpeedEngine`` whose ZeRO optimizer owns the gradients: they are reduced into
partitions during each backward and are not on ``p.grad``, and clipping is the engine's (its config's
``gradient_clipping``). Two things differ from DDP and FSDP2:

- accumulation: at ``gradient_accumulation_steps=1`` (Lightning's setting under manual optimization) every backward is
  an accumulation boundary, and ZeRO-1/2 then keeps only the last backward's gradient (allenai/open-instruct PR 1498);
  the non-final micro-batches of a minibatch are marked as inside an accumulation
  (``set_gradient_accumulation_boundary(False)``), as ``no_sync`` does for DDP;
- the checked step: the gradient norm exists only once the engine has stepped, so a non-finite loss (on any rank)
  skips the step, and the logged norm is the engine's ``get_global_grad_norm()`` of the step taken.

Not run on this project's CPU machines; ``tests/cli/test_gpu_strategies.py`` holds the GPU check.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Optional


def deepspeed_engine(trainer) -> Optional[Any]:
    """The ``DeepSpeedEngine`` Lightning wrapped the module in, or None under any other strategy."""
    engine = getattr(trainer, "model", None)
    return engine if callable(getattr(engine, "set_gradient_accumulation_boundary", None)) else None


@contextmanager
def accumulating(engine):
    """Backward passes inside are not accumulation boundaries: their gradients add up until the next one that is."""
    engine.set_gradient_accumulation_boundary(False)
    try:
        yield
    finally:
        engine.set_gradient_accumulation_boundary(True)


def deepspeed_step(engine, optimizer, skip: Callable[[bool, float], bool], loss_finite: bool) -> Optional[float]:
    """The checked optimizer step under DeepSpeed (see the module docstring): ``skip(loss_finite, grad_norm)`` decides
    (on every rank alike) whether to skip it; the norm is known only after the engine's step, so only the loss is
    judged here. Returns the engine's gradient norm of the step, or None for a skipped one."""
    if skip(loss_finite, 0.0):
        optimizer.zero_grad()
        return None
    optimizer.step()  # the engine's step: clipping from its config, then the partitioned update
    optimizer.zero_grad()
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")
