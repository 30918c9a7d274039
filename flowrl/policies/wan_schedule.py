"""The sigma grid of a Wan checkpoint's scheduler and the timesteps its pipeline feeds the transformer on it.

The published Wan checkpoints ship ``UniPCMultistepScheduler`` with flow sigmas: ``linspace(1, 1/1000, T + 1)[:-1]``
shifted by ``flow_shift`` (``s -> shift s / (1 + (shift - 1) s)``), a final 0, and **integer** timesteps
``int(1000 sigma)``; FlowMatchEuler (used by the tests' tiny pipelines) gives ``1000 sigma`` as floats. The sampler
carries sigmas; the transformer, and Wan 2.2's choice of expert, read the timestep, so the policy keeps the
scheduler's own timestep of every grid sigma it hands out (:class:`TimestepTable`).
"""

from __future__ import annotations

from typing import Optional

import diffusers
import torch
from torch import Tensor

#: UniPC moves a first flow sigma of exactly 1 down by this much (its solver takes log(1 - sigma))
UNIPC_EPS = 1e-6


def load_scheduler(path: str, flow_shift: Optional[float] = None):
    """The scheduler of the pipeline folder ``path`` (its own class), with ``flow_shift`` replacing the checkpoint's
    shift where given (``flow_shift`` for UniPC, ``shift`` for FlowMatchEuler), as Wan's docs swap it in.

    Raises:
        ValueError: a scheduler without a flow shift (not a flow-matching scheduler).
    """
    config = diffusers.FlowMatchEulerDiscreteScheduler.load_config(path, subfolder="scheduler")  # any class's: JSON
    cls = getattr(diffusers, config["_class_name"])
    scheduler = cls.from_pretrained(path, subfolder="scheduler")
    if flow_shift is None:
        return scheduler
    key = "flow_shift" if "flow_shift" in scheduler.config else "shift" if "shift" in scheduler.config else None
    if key is None:
        raise ValueError(f"policy.flow_shift={flow_shift}: the model's {cls.__name__} has no flow shift; leave it null")
    return cls.from_config(scheduler.config, **{key: flow_shift})


def scheduler_sigmas(scheduler, num_steps: int) -> tuple[Tensor, Tensor]:
    """``sigmas [T + 1]`` (float32, ending at 0) and the scheduler's ``timesteps [T]`` for ``num_steps``; a first
    sigma UniPC moved to ``1 - 1e-6`` is 1 again (the timestep stays the scheduler's, 999).

    >>> from diffusers import UniPCMultistepScheduler
    >>> unipc = UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0, prediction_type="flow_prediction")
    >>> sigmas, timesteps = scheduler_sigmas(unipc, 4)  # s = 1, 0.75025, 0.5005, 0.25075 -> 3s / (1 + 2s)
    >>> [round(s, 4) for s in sigmas.tolist()], timesteps.tolist()  # int(1000 (1 - 1e-6)) = 999, int(500.99) = 500
    ([1.0, 0.9001, 0.7504, 0.501, 0.0], [999, 900, 750, 500])
    """
    scheduler.set_timesteps(num_steps, device="cpu")
    sigmas = scheduler.sigmas.float().clone()
    if scheduler.config.get("use_flow_sigmas") and abs(float(sigmas[0]) - 1.0) <= 2 * UNIPC_EPS:
        sigmas[0] = 1.0
    return sigmas, scheduler.timesteps.clone()


def own_solver(scheduler):
    """A fresh copy of ``scheduler`` (its config, no step state) where its ``step`` is not flowrl's Euler ODE step
    (UniPC, as the published Wan folders ship), else None: what :meth:`~flowrl.policies.base.FlowPolicy.solver`
    returns, so that deterministic sampling integrates as the pipeline does.

    >>> from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler
    >>> own_solver(FlowMatchEulerDiscreteScheduler()) is None, type(own_solver(UniPCMultistepScheduler())).__name__
    (True, 'UniPCMultistepScheduler')
    """
    if isinstance(scheduler, diffusers.FlowMatchEulerDiscreteScheduler):
        return None
    return type(scheduler).from_config(scheduler.config)


class TimestepTable:
    """The scheduler's timestep of each sigma of the grids handed out; for any other sigma (a policy used before it
    made a grid, a method that trains at sigmas of its own) ``sigma * num_train_timesteps``, truncated to an integer
    below ``num_train_timesteps`` where the scheduler's timesteps are integers (UniPC).

    >>> table = TimestepTable(1000, integer=True)
    >>> table.remember(torch.tensor([1.0, 0.5]), torch.tensor([999, 499]))
    >>> table(torch.tensor([0.5, 1.0, 0.2505])).tolist()  # int(250.5) = 250
    [499.0, 999.0, 250.0]
    """

    def __init__(self, num_train_timesteps: int, integer: bool = False):
        self.num_train_timesteps, self.integer = num_train_timesteps, integer
        self.known: dict[float, float] = {}

    def remember(self, sigmas: Tensor, timesteps: Tensor) -> None:
        self.known.update(zip(sigmas.float().tolist(), timesteps.float().tolist()))

    def _default(self, sigma: float) -> float:
        t = sigma * self.num_train_timesteps
        return float(min(int(t), self.num_train_timesteps - 1)) if self.integer else t

    def __call__(self, sigma: Tensor) -> Tensor:
        values = [self.known[s] if s in self.known else self._default(s) for s in sigma.float().tolist()]
        return torch.tensor(values, dtype=torch.float32, device=sigma.device)
