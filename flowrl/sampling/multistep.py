"""A multistep ODE solver taking over the deterministic steps at the end of a rollout: MixGRPO-Flash (arXiv
2507.21802) integrates the steps after its SDE window with DPM-Solver++ instead of Euler.

The solver is a diffusers scheduler (``step(model_output, timestep, sample)``, keeping its own history of data
predictions) made to step on flowrl's grid: its ``sigmas`` are replaced by the rollout's, so the model is evaluated at
the same noise levels as without it, and only the update after ``start`` changes. As the authors' ``run_sample_step``
(``dpm_apply_strategy post``: ``dpm_state.update`` on every step up to the window's last), the solver is fed the model
output of every earlier step too, so its first step after the window is already of second order. Steps before
``start`` (the window, whose log-probs are trained) are the step loop's own, bit for bit.
"""

from __future__ import annotations

from torch import Tensor


class MultistepTail:
    """``scheduler``'s update on the steps ``start .. T - 1`` of the grid ``sigmas [T + 1]``, fed every step's model
    output (:func:`~flowrl.sampling.sampler.sample_from` calls :meth:`follow` once per step, in order, from step 0).

    Raises:
        ValueError: the scheduler gives another number of steps than the grid, or ``start`` is outside it.
    """

    def __init__(self, scheduler, sigmas: Tensor, start: int):
        num_steps = sigmas.numel() - 1
        if not 0 <= start <= num_steps:
            raise ValueError(f"MultistepTail: start {start} outside the {num_steps} steps")
        scheduler.set_timesteps(num_steps)  # also clears its multistep history
        if len(scheduler.timesteps) != num_steps:
            raise ValueError(f"{type(scheduler).__name__} gives {len(scheduler.timesteps)} timesteps for {num_steps} "
                             "steps; its step cannot follow this grid")
        scheduler.sigmas = sigmas.detach().float().cpu()  # flowrl's grid (diffusers keeps its sigmas on the CPU)
        scheduler.set_begin_index(0)  # step i is the grid's step i, whatever the timestep values
        self.scheduler, self.start = scheduler, start

    def follow(self, k: int, v: Tensor, z: Tensor, z_next: Tensor) -> Tensor:
        """The state after step ``k`` from ``z`` with model output ``v``: the solver's from ``start`` on, else the
        loop's ``z_next``; the solver records ``v`` either way."""
        solved = self.scheduler.step(v, self.scheduler.timesteps[k], z, return_dict=False)[0]
        return solved.to(z_next.dtype) if k >= self.start else z_next
