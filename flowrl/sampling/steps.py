"""One denoising step of a flow-matching sampler, with the Gaussian log-probability of its transition.

Every step kind is a pure function ``(z, v, sigma, sigma_next, noise) -> StepOutput`` on tensors: no model,
no scheduler object, no hidden step index. ``v`` is the velocity ``dz/dsigma`` of the rectified flow
``z_sigma = (1 - sigma) x0 + sigma * eps`` (the SD3 / FLUX convention), so ``x0_hat = z - sigma v`` and
``eps_hat = z + (1 - sigma) v``.

Kinds (``STEPS``):
- ``flow_grpo``: the SDE of Flow-GRPO (arXiv 2505.05470, Eq. 9), ``s = a * sqrt(sigma / (1 - sigma))``.
- ``cps``: coefficients-preserving sampling (arXiv 2509.05952), ``std = sigma_next * sin(a * pi / 2)``.
- ``dance``: the DanceGRPO SDE (arXiv 2505.07818), ``std = a * sqrt(sigma - sigma_next)``.
- ``ode``: the deterministic Euler step; its log-prob is zero and it is never trained.
- ``ddim``: DDIM with ``eta`` (arXiv 2010.02502, Eq. 12 and 16) for epsilon-prediction models (SD1.5), as DDPO
  (arXiv 2305.13301) samples and scores it; ``ddim_ode`` is its deterministic ``eta = 0`` form.

Diffusion (not flow) models fit the same ``(z, v, sigma, sigma_next)`` contract: ``v`` is the predicted noise
``eps`` and ``sigma = sqrt((1 - alpha_bar) / alpha_bar)`` is the noise-to-signal ratio of the variance-preserving
latent ``z = sqrt(alpha_bar) (x0 + sigma eps)``, a monotone noise level from which ``alpha_bar = 1 / (1 + sigma^2)``
follows without cancellation at either end of the schedule. :data:`PREDICTIONS` says what each kind reads from the
model; a policy declares what it predicts, and the loop checks that the two agree before any weight loads.

The log-prob is the Gaussian log-density of ``z_next`` **averaged over the latent dimensions**, the convention of
every peer: PPO clip ranges such as 1e-4 assume it. FlowCPS drops the ``1 / (2 std^2)`` factor and the constants
from its CPS log-prob; flowrl keeps the true density for every kind so that ratios mean the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class StepOutput:
    """The result of one step. Shapes: ``z_next``/``mean`` like ``z``; ``std`` broadcastable to ``z``;
    ``log_prob`` ``[B]`` (zero for deterministic steps)."""

    z_next: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Log-density of ``x`` under ``N(mean, std^2)`` averaged over every dimension but the first.

    Args:
        x, mean: ``[B, ...]``.
        std: broadcastable to ``x``, strictly positive.
    Returns:
        ``[B]`` float32.

    >>> round(gaussian_log_prob(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1, 1)).item(), 4)
    -0.9189
    """
    x, mean, std = x.float(), mean.float(), std.float()
    log_density = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - _LOG_SQRT_2PI
    return log_density.flatten(1).mean(dim=1)


def _per_sample(sigma: Tensor | float, like: Tensor) -> Tensor:
    """A scalar or ``[B]`` value (a sigma, a noise level) as float32 ``[B, 1, 1, ...]`` broadcasting against ``like``."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32, device=like.device)
    if sigma.ndim == 0:
        sigma = sigma.expand(like.shape[0])
    return sigma.reshape(-1, *([1] * (like.ndim - 1)))


def _finish(mean: Tensor, std: Tensor, noise: Optional[Tensor], z_next: Optional[Tensor]) -> StepOutput:
    if z_next is None:
        if noise is None:
            raise ValueError("a stochastic step needs `noise` (to sample) or `z_next` (to score a recorded sample)")
        z_next = mean + std * noise.float()
    return StepOutput(z_next=z_next.float(), mean=mean, std=std, log_prob=gaussian_log_prob(z_next, mean, std))


def flow_grpo_step(z, v, sigma, sigma_next, noise=None, z_next=None, noise_level: float | Tensor = 0.7) -> StepOutput:
    """Flow-GRPO SDE step.

    ``mean = z (1 + s^2 dt / (2 sigma)) + v (1 + s^2 (1 - sigma) / (2 sigma)) dt``, ``std = s sqrt(-dt)`` with
    ``dt = sigma_next - sigma < 0`` and ``s = noise_level * sqrt(sigma / (1 - sigma))``. At ``sigma == 1`` the
    denominator uses ``sigma_next`` instead, as flow_grpo does (it substitutes ``sigmas[1]``, which is the
    ``sigma_next`` of that first step).

    Args:
        z, v: ``[B, ...]`` latents and velocity; sigma, sigma_next: scalars or ``[B]``.
        noise: standard normal like ``z`` (to sample) or ``z_next`` (to score a recorded sample).
    Returns:
        :class:`StepOutput`.

    >>> out = flow_grpo_step(torch.tensor([[0.5]]), torch.tensor([[-1.0]]), 0.7904, 0.7073, torch.zeros(1, 1))
    >>> round(out.mean.item(), 4), round(out.std.item(), 4)
    (0.5549, 0.3919)
    """
    zf, vf = z.float(), v.float()
    sigma, sigma_next = _per_sample(sigma, z), _per_sample(sigma_next, z)
    dt = sigma_next - sigma
    a = _per_sample(noise_level, z)
    s = a * torch.sqrt(sigma / (1 - torch.where(sigma >= 1, sigma_next, sigma)))
    mean = zf * (1 + s**2 / (2 * sigma) * dt) + vf * (1 + s**2 * (1 - sigma) / (2 * sigma)) * dt
    return _finish(mean, s * torch.sqrt(-dt), noise, z_next)


def cps_step(z, v, sigma, sigma_next, noise=None, z_next=None, noise_level: float | Tensor = 0.7) -> StepOutput:
    """Coefficients-preserving step: ``mean = x0_hat (1 - sigma_next) + eps_hat sqrt(sigma_next^2 - std^2)``,
    ``std = sigma_next sin(noise_level pi / 2)``. At ``sigma_next == 0`` it is the exact ODE landing on
    ``x0_hat`` (std 0), so that step cannot carry a log-prob: rollouts mark it as not trained.

    >>> out = cps_step(torch.tensor([[0.5]]), torch.tensor([[-1.0]]), 0.7904, 0.7073, torch.zeros(1, 1))
    >>> round(out.mean.item(), 4), round(out.std.item(), 4)
    (0.4709, 0.6302)
    """
    zf, vf = z.float(), v.float()
    sigma, sigma_next = _per_sample(sigma, z), _per_sample(sigma_next, z)
    std = sigma_next * torch.sin(_per_sample(noise_level, z) * (math.pi / 2))
    x0_hat, eps_hat = zf - sigma * vf, zf + (1 - sigma) * vf
    mean = x0_hat * (1 - sigma_next) + eps_hat * torch.sqrt(sigma_next**2 - std**2)
    return _finish(mean, std.clamp_min(torch.finfo(torch.float32).tiny), noise, z_next)


def dance_step(z, v, sigma, sigma_next, noise=None, z_next=None, noise_level: float | Tensor = 0.3) -> StepOutput:
    """DanceGRPO SDE step: ``mean = z + dt v - (noise_level^2 / 2) score dt`` with the score
    ``-(z - (1 - sigma) x0_hat) / sigma^2``, ``std = noise_level sqrt(-dt)``.

    >>> out = dance_step(torch.tensor([[0.5]]), torch.tensor([[-1.0]]), 0.7904, 0.7073, torch.zeros(1, 1))
    >>> round(out.mean.item(), 4), round(out.std.item(), 4)
    (0.5817, 0.0865)
    """
    zf, vf = z.float(), v.float()
    sigma, sigma_next = _per_sample(sigma, z), _per_sample(sigma_next, z)
    dt = sigma_next - sigma
    score = -(zf - (1 - sigma) * (zf - sigma * vf)) / sigma**2
    a = _per_sample(noise_level, z)
    mean = zf + dt * vf - 0.5 * a**2 * score * dt
    return _finish(mean, a * torch.sqrt(-dt), noise, z_next)


def ode_step(z, v, sigma, sigma_next, noise=None, z_next=None, noise_level: float | Tensor = 0.0) -> StepOutput:
    """Deterministic Euler step ``z + (sigma_next - sigma) v``; log-prob zero, std zero.

    >>> round(ode_step(torch.tensor([[0.5]]), torch.tensor([[-1.0]]), 0.7904, 0.7073).z_next.item(), 4)
    0.5831
    """
    zf = z.float()
    mean = zf + (_per_sample(sigma_next, z) - _per_sample(sigma, z)) * v.float()
    zero = torch.zeros(z.shape[0], device=z.device)
    return StepOutput(z_next=mean, mean=mean, std=torch.zeros_like(zero), log_prob=zero)


def ddim_step(z, v, sigma, sigma_next, noise=None, z_next=None, noise_level: float | Tensor = 1.0) -> StepOutput:
    """DDIM step of an epsilon-prediction model, diffusers' ``DDIMScheduler.step`` with ``eta = noise_level``.

    With ``alpha_bar = 1 / (1 + sigma^2)`` (``a``, and ``a'`` at ``sigma_next``): ``x0_hat = (z - sqrt(1 - a) eps) /
    sqrt(a)``, ``std = eta sqrt((1 - a') / (1 - a) (1 - a / a'))``, ``mean = sqrt(a') x0_hat + sqrt(1 - a' - std^2)
    eps``. The coefficients are formed in float64 from the sigmas, the latents stay float32. The log-prob is DDPO's
    (``ddim_step_with_logprob``: the Gaussian density of ``z_next`` averaged over latent dimensions, flowrl's
    convention as well); where ``std`` is zero (``eta = 0``, or ``sigma_next`` equal to ``sigma`` or 0) the step is
    deterministic and its log-prob is 0, as for ``ode``. x0 is not clipped (SD1.5's ``clip_sample`` is false).

    Args:
        z: ``[B, ...]`` latents; v: ``[B, ...]`` predicted noise; sigma, sigma_next: scalars or ``[B]``
            noise-to-signal ratios (see the module docstring); noise_level: ``eta``, scalar or ``[B]``.
        noise: standard normal like ``z`` (to sample) or ``z_next`` (to score a recorded sample).
    Returns:
        :class:`StepOutput`.

    ``a = 0.5`` (sigma 1), ``a' = 0.8`` (sigma 0.5), eta 1: ``x0_hat = sqrt(2) - 0.5 = 0.9142``, ``std^2 = 0.4 *
    0.375 = 0.15``, ``mean = sqrt(0.8) 0.9142 + sqrt(0.05) 0.5 = 0.9295``:

    >>> out = ddim_step(torch.tensor([[1.0]]), torch.tensor([[0.5]]), 1.0, 0.5, torch.zeros(1, 1), noise_level=1.0)
    >>> round(out.mean.item(), 4), round(out.std.item() ** 2, 4)
    (0.9295, 0.15)
    """
    s, s_next = _per_sample(sigma, z).double(), _per_sample(sigma_next, z).double()
    eta = _per_sample(noise_level, z).double()
    alpha, alpha_next = 1 / (1 + s**2), 1 / (1 + s_next**2)
    # (1 - a') / (1 - a) * (1 - a / a') in sigmas: no difference of two numbers near 1
    variance = s_next**2 * (s**2 - s_next**2) / (s**2 * (1 + s_next**2))
    std = eta * variance.clamp_min(0).sqrt()
    direction = (s_next**2 / (1 + s_next**2) - std**2).sqrt()
    # mean = sqrt(a') x0_hat + direction eps with x0_hat = z sqrt(1 + s^2) - s eps
    z_coef = (alpha_next / alpha).sqrt()
    eps_coef = direction - alpha_next.sqrt() * s
    mean = z_coef.float() * z.float() + eps_coef.float() * v.float()
    std = std.float()
    stochastic = std > 0
    if z_next is None:
        if noise is None and bool(stochastic.any()):
            raise ValueError("a stochastic step needs `noise` (to sample) or `z_next` (to score a recorded sample)")
        z_next = mean if noise is None else mean + std * noise.float()
    log_prob = gaussian_log_prob(z_next, mean, torch.where(stochastic, std, torch.ones_like(std)))
    return StepOutput(z_next=z_next.float(), mean=mean, std=std,
                      log_prob=torch.where(stochastic.reshape(-1), log_prob, torch.zeros_like(log_prob)))


def ddim_ode_step(z, v, sigma, sigma_next, noise=None, z_next=None, noise_level: float | Tensor = 0.0) -> StepOutput:
    """Deterministic DDIM (``eta = 0``) whatever ``noise_level``; log-prob zero, never trained.

    As in :func:`ddim_step`'s example with ``std = 0``: ``sqrt(0.8) 0.9142 + sqrt(0.2) 0.5 = 1.0413``.

    >>> round(ddim_ode_step(torch.tensor([[1.0]]), torch.tensor([[0.5]]), 1.0, 0.5).z_next.item(), 4)
    1.0413
    """
    return ddim_step(z, v, sigma, sigma_next, noise_level=0.0)


StepFn = Callable[..., StepOutput]
STEPS: dict[str, StepFn] = {"flow_grpo": flow_grpo_step, "cps": cps_step, "dance": dance_step, "ode": ode_step,
                            "ddim": ddim_step, "ddim_ode": ddim_ode_step}
#: What each step kind reads as ``v``: the flow velocity or the diffusion model's noise prediction.
PREDICTIONS: dict[str, str] = {"flow_grpo": "velocity", "cps": "velocity", "dance": "velocity", "ode": "velocity",
                               "ddim": "epsilon", "ddim_ode": "epsilon"}
#: The largest ``noise_level`` a step kind is defined for (DDIM's ``eta``: past 1 its variance exceeds the step's and
#: the mean's coefficient is the square root of a negative number); the other kinds take any positive level.
MAX_NOISE_LEVEL: dict[str, float] = {"ddim": 1.0}
#: The deterministic step of each prediction: ODE sampling, evaluation, and steps outside an SDE window.
ODE_STEPS: dict[str, str] = {"velocity": "ode", "epsilon": "ddim_ode"}


def ode_kind(step_kind: str) -> str:
    """The deterministic step that goes with ``step_kind`` (the same model prediction).

    >>> ode_kind("flow_grpo"), ode_kind("ddim")
    ('ode', 'ddim_ode')
    """
    get_step(step_kind)  # unknown kinds fail with the list of known ones
    return ODE_STEPS[PREDICTIONS[step_kind]]


def get_step(kind: str) -> StepFn:
    """The step function named ``kind``; raises ``ValueError`` listing the known kinds."""
    if kind not in STEPS:
        raise ValueError(f"unknown sampler step {kind!r}; choose one of {sorted(STEPS)}")
    return STEPS[kind]
