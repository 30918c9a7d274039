"""The sigma grids of the flow-matching pipelines, through diffusers' own functions.

Every pipeline computes its schedule the same way in its ``__call__``: a base grid (``linspace(1, 1/T, T)`` for
FLUX.1, FLUX.2 and Qwen-Image, Z-Image's ``get_default_z_image_sigmas``, the scheduler's own for SD3), a ``mu`` of
the image's token count (diffusers' ``calculate_shift`` with the scheduler config's bounds, FLUX.2's
``compute_empirical_mu``), and ``retrieve_timesteps``, which hands both to the scheduler's ``set_timesteps`` (the static
or dynamic shift and the terminal stretch that the config asks for happen there). The adapters call these same
functions with the same arguments, so their grids are the pipelines' bit for bit
(``tests/policies/test_flow_sigmas.py``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from torch import Tensor

#: ``calculate_shift``'s ``max_shift`` where the scheduler config has none: FLUX.1, Qwen-Image and Z-Image pass 1.15
FLUX_MAX_SHIFT = 1.15
#: ... and StableDiffusion3Pipeline 1.16
SD3_MAX_SHIFT = 1.16


def token_mu(config, image_seq_len: int, max_shift: float = FLUX_MAX_SHIFT) -> float:
    """The pipelines' ``mu``: ``calculate_shift`` of ``image_seq_len`` tokens with the bounds of the scheduler
    ``config`` (each missing key the pipelines' default; ``max_shift`` differs between them).

    >>> round(token_mu({"base_image_seq_len": 16, "max_image_seq_len": 256}, 64), 4)  # 0.5 + 48 * 0.65 / 240
    0.63
    """
    return calculate_shift(image_seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                           config.get("base_shift", 0.5), config.get("max_shift", max_shift))


def linear_grid(num_steps: int, config=None) -> Optional[np.ndarray]:
    """``linspace(1, 1/T, T)``, the FLUX and Qwen-Image pipelines' base grid; None (the scheduler's own grid) where
    ``config`` is given and sets ``use_flow_sigmas``, as FluxPipeline and the FLUX.2 pipelines decide.

    >>> linear_grid(4).tolist(), linear_grid(4, {"use_flow_sigmas": True})
    ([1.0, 0.75, 0.5, 0.25], None)
    """
    if config is not None and config.get("use_flow_sigmas"):
        return None
    return np.linspace(1.0, 1 / num_steps, num_steps)


def pipeline_sigmas(scheduler: FlowMatchEulerDiscreteScheduler, num_steps: int,
                    sigmas: Optional[Sequence[float]] = None, mu: Optional[float] = None) -> Tensor:
    """``[T + 1]`` float32, ending at 0: the scheduler's sigmas after ``retrieve_timesteps(scheduler, T,
    sigmas=sigmas, mu=mu)``, the call every flow pipeline makes (it sets the scheduler's timesteps, as the pipeline
    leaves them)."""
    retrieve_timesteps(scheduler, num_steps, "cpu", sigmas=sigmas, mu=mu)  # mu=None: the scheduler's default
    return scheduler.sigmas.float().clone()
