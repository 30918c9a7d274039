"""The one step loop, ``sample_from``, its step primitive, and the noise it consumes.

Every model evaluation of sampling goes through one primitive: :func:`model_velocity` (the model on a batch of
states, ``chunk_size`` rows per call) followed by :func:`apply_step` (the step kind's SDE on the rows that branch,
its ODE on the others). :func:`sample_from` loops that primitive over steps: it continues a batch of trajectories
from states at any step of a schedule, with a per-row, per-step choice of SDE or ODE, the caller's noise, and
optionally a schedule and a step count of each row's own (a row that has taken its steps leaves the later calls).
Plain sampling (:func:`sample`), a window of SDE steps inside an ODE trajectory (TP-GRPO) and ODE completions of
intermediate states (:func:`~flowrl.sampling.ode_complete.ode_complete`: per-row remaining schedules) are calls of
it. The tree sampler (:mod:`flowrl.sampling.tree`) applies the same primitive at each step of its frontier and then
splits: a node's children reuse its one model evaluation, which a loop over rows cannot express. Every model call
has one signature, :data:`VelocityFn`.

Noise is drawn per row from a CPU generator seeded by that row's seed (the initial noise first, then one draw per
step), so a trajectory depends only on its seed, its prompt and the weights: not on the batch it shares, the rank it
runs on or the device's kernels' draw order. A branch's seed is derived from its tree's seed and its path of child
indices (:func:`branch_seed`), so the same config gives the same tree bit for bit on any number of processes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch
from torch import Tensor

from flowrl.sampling.coarse_tail import expand_to_grid, grid_problem
from flowrl.sampling.steps import ODE_STEPS, StepOutput, get_step, ode_kind

if TYPE_CHECKING:
    from flowrl.sampling.multistep import MultistepTail

#: ``velocity(z [M, ...], sigma [M], rows [M] long) -> v [M, ...]``: the model with its guidance bound; ``rows``
#: index the batch's conditioning (the prompt, and its images, of each state).
VelocityFn = Callable[[Tensor, Tensor, Tensor], Tensor]

_MASK64 = (1 << 64) - 1


def seeded_noise(seeds: Tensor, shape: Sequence[int], draws: int, device: torch.device | str = "cpu") -> Tensor:
    """Standard normal noise ``[B, draws, *shape]``, row ``i`` from a CPU generator seeded with ``seeds[i]``.

    >>> a = seeded_noise(torch.tensor([7, 8]), (2,), 3); b = seeded_noise(torch.tensor([8]), (2,), 3)
    >>> torch.equal(a[1], b[0])
    True
    """
    rows = []
    for seed in seeds.tolist():
        gen = torch.Generator().manual_seed(int(seed))
        rows.append(torch.randn((draws, *shape), generator=gen))
    return torch.stack(rows).to(device)


class NoiseStream:
    """:func:`seeded_noise` ``[B, draws, *shape]`` handed out one draw at a time, so that a rollout holds one step's
    noise instead of every step's (for a video the noise of all steps is as large as its trajectory).

    Each row's generator continues where the last draw ended. torch fills normal noise in blocks of 16 values, so
    draws of ``numel(shape) % 16 == 0`` values each are exactly :func:`seeded_noise`'s; other shapes (no real
    model's) draw everything at once as :func:`seeded_noise` does, keeping the numbers a seed has always given.

    >>> stream = NoiseStream(torch.tensor([7, 8]), (4, 4), 3)
    >>> torch.equal(torch.stack([stream.draw(i) for i in range(3)], 1), seeded_noise(torch.tensor([7, 8]), (4, 4), 3))
    True
    """

    def __init__(self, seeds: Tensor, shape: Sequence[int], draws: int, device: torch.device | str = "cpu"):
        self.rows, self.draws, self.latent_shape = len(seeds), draws, tuple(shape)
        self.device, self.taken, self.offset = device, 0, 0
        if math.prod(shape) % 16 == 0:
            self.generators, self.all = [torch.Generator().manual_seed(int(s)) for s in seeds.tolist()], None
        else:
            self.generators, self.all = [], seeded_noise(seeds, shape, draws, device)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the noise tensor it stands for, ``[B, draws, *shape]`` (its draws from :meth:`rest` on)."""
        return (self.rows, self.draws - self.offset, *self.latent_shape)

    def rest(self) -> "NoiseStream":
        """The draws not yet taken, numbered from 0 (``sample_from``'s steps after the initial noise)."""
        self.offset = self.taken
        return self

    def first(self, draws: int) -> "NoiseStream":
        """Only its first ``draws`` draws (a coarser grid's steps), each the number the whole stream gives there."""
        self.draws = min(draws, self.draws)
        return self

    def draw(self, i: int) -> Tensor:
        """Draw ``i`` of every row ``[B, *shape]``; draws are taken in order, each once."""
        k = self.offset + i
        if k != self.taken or k >= self.draws:
            raise IndexError(f"NoiseStream: draw {k} asked for; draw {self.taken} of {self.draws} is next")
        self.taken += 1
        if self.all is not None:
            return self.all[:, k]
        return torch.stack([torch.randn(self.latent_shape, generator=g) for g in self.generators]).to(self.device)


def branch_seed(seed: int, path: Sequence[int]) -> int:
    """The seed of the node reached from a tree seeded ``seed`` by the child indices ``path`` (splitmix64 mixing of
    each step of the path, so siblings and cousins get unrelated noise); the empty path is the tree's own seed.

    >>> branch_seed(5, []), branch_seed(5, [0]) != branch_seed(5, [1]), branch_seed(5, [0, 1]) != branch_seed(5, [1, 0])
    (5, True, True)
    >>> 0 <= branch_seed(2**62, [3, 1, 4]) < 2**63
    True
    """
    value = int(seed)
    for child in path:
        z = (value + 0x9E3779B97F4A7C15 * (int(child) + 1)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        value = (z ^ (z >> 31)) >> 1  # a non-negative int64 for torch.Generator.manual_seed and long tensors
    return value


def path_noise(seeds: Tensor, paths: Sequence[Sequence[int]], shape: Sequence[int], draws: int,
               device: torch.device | str = "cpu") -> Tensor:
    """Noise ``[B, draws, *shape]`` for rows that continue a tree along ``paths``: row ``i`` draws from
    ``branch_seed(seeds[i], paths[i])``.

    >>> n = path_noise(torch.tensor([3, 3]), [[0], [1]], (2,), 1)
    >>> torch.equal(n[0], n[1]), torch.equal(path_noise(torch.tensor([3]), [[]], (2,), 1), seeded_noise(
    ...     torch.tensor([3]), (2,), 1))
    (False, True)
    """
    return seeded_noise(torch.tensor([branch_seed(s, p) for s, p in zip(seeds.tolist(), paths)]), shape, draws,
                        device)


def model_velocity(velocity: VelocityFn, z: Tensor, sigma: Tensor, rows: Tensor,
                   chunk_size: Optional[int] = None) -> Tensor:
    """The model output ``[M, ...]`` of states ``z [M, ...]`` at ``sigma [M]``, at most ``chunk_size`` rows per call.

    >>> v = lambda z, s, rows: z * s[:, None] + rows[:, None]
    >>> model_velocity(v, torch.ones(3, 1), torch.full((3,), 2.0), torch.arange(3), chunk_size=2).flatten().tolist()
    [2.0, 3.0, 4.0]
    """
    size = chunk_size or max(len(z), 1)
    if len(z) <= size:
        return velocity(z, sigma, rows)
    return torch.cat([velocity(z[i:i + size], sigma[i:i + size], rows[i:i + size]) for i in range(0, len(z), size)])


def apply_step(z: Tensor, v: Tensor, sigma: Tensor, sigma_next: Tensor, step_kind: str, sde: Tensor,
               noise: Optional[Tensor] = None, noise_level: float | Tensor = 0.7) -> StepOutput:
    """One step of every row from its model output ``v``: ``step_kind``'s SDE where ``sde [M]`` is True, its
    deterministic form (:func:`~flowrl.sampling.steps.ode_kind`) elsewhere. Only the ``z_next`` and ``log_prob`` of
    the result are per row; ``mean`` and ``std`` are the SDE's where any row branches.

    >>> out = apply_step(torch.zeros(2, 1), torch.ones(2, 1), torch.ones(2), torch.full((2,), 0.5), "flow_grpo",
    ...                  torch.tensor([False, True]), noise=torch.zeros(2, 1))
    >>> out.z_next.flatten().tolist(), out.log_prob[0].item()  # the ODE row: z - 0.5 v; the SDE row: its mean
    ([-0.5, -0.5], 0.0)
    """
    sde = sde.cpu()
    kinds = ((get_step(step_kind), bool(sde.any())), (get_step(ode_kind(step_kind)), not bool(sde.all())))
    outs = [step(z, v, sigma, sigma_next, noise=noise, noise_level=noise_level) for step, needed in kinds if needed]
    if len(outs) == 1:
        return outs[0]
    pick = sde.to(z.device)  # a step on which some rows branch (SDE) and others follow the ODE
    return StepOutput(z_next=torch.where(pick.view(-1, *[1] * (z.dim() - 1)), outs[0].z_next, outs[1].z_next),
                      mean=outs[0].mean, std=outs[0].std,
                      log_prob=torch.where(pick, outs[0].log_prob, outs[1].log_prob))


@torch.no_grad()
def sample_from(velocity: VelocityFn, z: Tensor, sigmas: Tensor, start: int = 0, noise: Optional[Tensor] = None,
                step_kind: str = "flow_grpo", sde_mask: Optional[Tensor] = None, noise_level: float | Tensor = 0.7,
                velocities: Optional[list[Tensor]] = None, rows: Optional[Tensor] = None,
                steps: Optional[Tensor] = None, chunk_size: Optional[int] = None,
                keep_states: bool = True, tail: Optional["MultistepTail"] = None) -> tuple[Tensor, Tensor]:
    """Continue trajectories from states ``z [R, ...]`` at step ``start`` for ``n`` steps.

    Args:
        velocity: the bound model (see :data:`VelocityFn`).
        z: ``[R, *latent_shape]`` the states at step ``start``.
        sigmas: ``[T + 1]`` the schedule every row follows, or ``[R, S + 1]`` one per row (an ODE completion's
            remaining schedule). start: the step ``z`` is at.
        noise: ``[R, n, *latent_shape]`` the noise of steps ``start .. start + n - 1`` (ignored on ODE steps), or a
            :class:`NoiseStream` that draws it step by step; None: the ODE on every step.
        step_kind: the SDE step; where ``sde_mask`` is False its deterministic form (``ode_kind``) runs instead.
        sde_mask: ``[n]`` or ``[R, n]`` bool, per step or per row and step; None: the SDE on every step (the ODE
            without ``noise``).
        noise_level: a float or ``[T]`` per schedule step (e.g. calibrated noise).
        velocities: a list that receives the model output of each step (for estimates that reuse it).
        rows: ``[R]`` long, the conditioning row of each state (None: row ``i`` by row ``i``).
        steps: ``[R]`` long, the steps each row takes (None: ``n`` each, ``n`` being ``noise``'s, else the rest of
            the schedule); a row that has taken its steps is left out of later model calls.
        chunk_size: at most this many rows per model call (None: every active row at once).
        keep_states: return every state, or only each row's last (``[R, 1, ...]``).
        tail: a multistep solver that takes over the (deterministic) steps from its ``start`` on (MixGRPO-Flash's
            after the window; :class:`~flowrl.sampling.multistep.MultistepTail`), fed every step's model output; only
            for every row on one schedule from step 0.
    Returns:
        latents ``[R, n + 1, *latent_shape]`` (``z`` first) and log_probs ``[R, n]`` (float32, 0 on ODE steps and
        after a row's last step).
    """
    batch = z.shape[0]
    if tail is not None and (start != 0 or steps is not None or sigmas.ndim != 1):
        raise ValueError("a multistep tail follows whole trajectories from step 0 on one schedule")
    if steps is not None:
        n = int(steps.max()) if batch else 0
    else:
        n = noise.shape[1] if noise is not None else sigmas.shape[-1] - 1 - start
    levels = torch.as_tensor(noise_level, dtype=torch.float32).expand(sigmas.shape[-1] - 1)
    mask = torch.full((n,), noise is not None, dtype=torch.bool) if sde_mask is None else sde_mask
    mask = mask.expand(batch, n).cpu()
    rows = torch.arange(batch, device=z.device) if rows is None else rows
    latents = torch.empty((batch, n + 1 if keep_states else 1, *z.shape[1:]), device=z.device, dtype=z.dtype)
    latents[:, 0] = z
    log_probs = torch.zeros(batch, n, device=z.device)
    for i in range(n):
        k = start + i
        active = torch.arange(batch) if steps is None else (steps.cpu() > i).nonzero().squeeze(1)
        every = len(active) == batch  # then the whole batch goes in, as it is
        if sigmas.ndim == 2:  # each row's own schedule
            sigma, sigma_next = sigmas[active.to(sigmas.device), k], sigmas[active.to(sigmas.device), k + 1]
        else:
            sigma, sigma_next = sigmas[k].expand(len(active)), sigmas[k + 1].expand(len(active))
        sigma, sigma_next = sigma.to(z.device), sigma_next.to(z.device)
        here = active.to(z.device)
        z_in = z if every else z[here]
        v = model_velocity(velocity, z_in, sigma, rows if every else rows[active.to(rows.device)], chunk_size)
        if velocities is not None:
            velocities.append(v)
        step_noise = None if noise is None else noise.draw(i) if isinstance(noise, NoiseStream) else noise[:, i]
        step_noise = step_noise if step_noise is None or every else step_noise[active.to(step_noise.device)]
        out = apply_step(z_in, v, sigma, sigma_next, step_kind, mask[active, i], step_noise, levels[k])
        z_next = out.z_next if tail is None else tail.follow(k, v, z_in, out.z_next)
        z = z_next if every else z.index_put((here,), z_next.to(z.dtype))
        if keep_states:
            latents[:, i + 1] = z
        log_probs[here, i] = out.log_prob
    if not keep_states:
        latents[:, 0] = z
    return latents, log_probs


@torch.no_grad()
def sample(velocity: VelocityFn, seeds: Tensor, sigmas: Tensor, latent_shape: Sequence[int],
           step_kind: str = "flow_grpo", noise_level: float | Tensor = 0.7, sde_mask: Optional[Tensor] = None,
           device: torch.device | str = "cpu", velocities: Optional[list[Tensor]] = None,
           tail: Optional["MultistepTail"] = None, grid: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Whole trajectories from seeded noise along ``sigmas [T+1]``: ``sample_from`` step 0 with ``seeded_noise``
    (``tail``: see :func:`sample_from`).

    Args:
        seeds: ``[B]`` long. sigmas: ``[T + 1]`` from 1 to 0. sde_mask: ``[T]`` or ``[B, T]`` (default: the SDE
            on every step of an SDE kind, none for an ODE kind).
        grid: ``[n + 1]`` long, the indices of ``sigmas`` the model runs at (MixGRPO-Flash's coarser tail:
            :func:`~flowrl.sampling.coarse_tail.coarse_grid`; None: every one), ``tail`` built on ``sigmas[grid]``;
            the steps up to the first merged one, their noise included, are those of the full grid.
    Returns:
        latents ``[B, T+1, *latent_shape]`` and log_probs ``[B, T]`` (float32), on the full grid (skipped states
        interpolated: :func:`~flowrl.sampling.coarse_tail.expand_to_grid`).
    Raises:
        ValueError: ``grid`` merges a stochastic step, or does not run from 0 to ``T``.
    """
    num_steps = sigmas.numel() - 1
    sde_mask = sde_steps(num_steps, step_kind) if sde_mask is None else sde_mask
    noise = NoiseStream(seeds, latent_shape, num_steps + 1, device)  # seeded_noise [B, T+1, ...], a step at a time
    z0 = noise.draw(0)
    if grid is None:
        return sample_from(velocity, z0, sigmas, 0, noise.rest(), step_kind, sde_mask, noise_level, velocities,
                           tail=tail)
    if problem := grid_problem(sde_mask, grid):
        raise ValueError(f"sample: {problem}")
    steps = grid[:-1].cpu()
    levels = torch.as_tensor(noise_level, dtype=torch.float32).expand(num_steps)[steps]
    latents, log_probs = sample_from(velocity, z0, sigmas[grid.to(sigmas.device)], 0, noise.first(len(grid)).rest(),
                                     step_kind, sde_mask[..., steps.to(sde_mask.device)], levels, velocities,
                                     tail=tail)
    return expand_to_grid(latents, log_probs, sigmas, grid)


def sde_steps(num_steps: int, step_kind: str, sde_window: Optional[tuple[int, int]] = None) -> Tensor:
    """Which steps are stochastic ``[T]`` bool: all, or those in ``[start, end)``; a deterministic kind (``ode``,
    ``ddim_ode``) has none."""
    mask = torch.zeros(num_steps, dtype=torch.bool)
    if step_kind not in ODE_STEPS.values():
        start, end = sde_window or (0, num_steps)
        mask[start:end] = True
    return mask


def fraction_steps(num_steps: int, timestep_fraction: float) -> int:
    """How many of ``num_steps`` steps a timestep fraction covers: ``floor(T * timestep_fraction)``, flow_grpo's rule
    (``int(num_steps * timestep_fraction)``). Flow-GRPO trains and TempFlow-GRPO branches on the first that many;
    DiffusionNFT trains each sample at that many of the schedule's noise levels.

    >>> fraction_steps(10, 0.99), fraction_steps(10, 1.0), fraction_steps(4, 0.1)
    (9, 10, 0)
    """
    return math.floor(num_steps * timestep_fraction)


def fraction_problems(timestep_fraction: float) -> list[str]:
    """The range of a timestep fraction, ``(0, 1]``, as the problem a method's check reports (empty when it holds).

    >>> fraction_problems(0.99), fraction_problems(0)[0][:43]
    ([], 'model.timestep_fraction=0 must be in (0, 1]')
    """
    if 0 < timestep_fraction <= 1:  # also rejects NaN
        return []
    return [f"model.timestep_fraction={timestep_fraction} must be in (0, 1]: the share of the T steps trained, "
            "floor(T x fraction) of them (the papers' code: 0.99)"]


def trained_steps(sde_mask: Tensor, timestep_fraction: float, sigmas: Tensor, step_kind: str) -> Tensor:
    """Steps the loss trains ``[T]`` (or ``[B, T]`` from a per-row ``sde_mask``): stochastic steps among the first ``floor(T * timestep_fraction)`` (as
    flow_grpo), minus steps whose transition has zero std (CPS landing on sigma = 0; DDIM landing on sigma = 0 or
    not moving, as SD1.5's last step does with ``steps_offset = 0``).

    >>> trained_steps(torch.ones(10, dtype=torch.bool), 0.99, torch.linspace(1, 0, 11), "flow_grpo").sum().item()
    9
    """
    num_steps = sde_mask.shape[-1]
    mask = sde_mask.clone()
    mask[..., fraction_steps(num_steps, timestep_fraction):] = False
    if step_kind == "cps":
        mask &= sigmas[1:] > 0
    if step_kind == "ddim":
        mask &= (sigmas[1:] > 0) & (sigmas[1:] < sigmas[:-1])
    return mask
