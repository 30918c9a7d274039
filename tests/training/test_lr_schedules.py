"""Learning-rate schedules under manual optimization: one scheduler per optimizer (TDM-R1 has three), stepped by
``step_schedulers`` whatever Lightning's ``lr_schedulers()`` returned."""

import torch

from flowrl.training.lr_schedules import step_schedulers, with_schedulers


def optimizers(n: int) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0) for _ in range(n)]


def halving(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_no_factory_returns_the_optimizers_untouched():
    opts = optimizers(3)
    assert with_schedulers(opts, None) is opts


def test_each_optimizer_gets_its_own_scheduler_and_each_steps_once():
    opts, scheds = with_schedulers(optimizers(3), halving)
    assert [s.optimizer for s in scheds] == opts
    step_schedulers(scheds)
    step_schedulers(scheds[0])  # Lightning returns a lone scheduler unwrapped
    step_schedulers(None)  # and None without schedulers
    assert [o.param_groups[0]["lr"] for o in opts] == [0.25, 0.5, 0.5]
