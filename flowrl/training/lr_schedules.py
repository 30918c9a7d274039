"""Learning-rate schedules under manual optimization: every method steps its own optimizers, so Lightning leaves
the schedulers ``configure_optimizers`` returns to the module. flowrl steps each once per training batch (a batch's
minibatch steps share its rate), after the update; Lightning saves and restores their state with the checkpoint, so a
resumed run goes on where the schedule was."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch


def with_schedulers(optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer],
                    factory: Optional[Callable[[torch.optim.Optimizer], Any]]) -> Any:
    """What ``configure_optimizers`` returns: the optimizers alone, or with one scheduler from ``factory`` each.

    >>> w = torch.nn.Parameter(torch.ones(1)); opt = torch.optim.SGD([w], lr=1.0)
    >>> opts, scheds = with_schedulers(opt, lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5))
    >>> len(opts), type(scheds[0]).__name__
    (1, 'StepLR')
    """
    if factory is None:
        return optimizers
    optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
    return optimizers, [factory(optimizer) for optimizer in optimizers]


def step_schedulers(schedulers: Any) -> None:
    """One step of every scheduler ``LightningModule.lr_schedulers()`` returned (None, one, or a list)."""
    for scheduler in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
        scheduler.step()
