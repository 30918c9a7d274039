"""diffusers' multistep ODE solvers for flow models, by name: what MixGRPO-Flash (arXiv 2507.21802) steps after its
SDE window instead of Euler. The solver's update runs on flowrl's own grid (:class:`~flowrl.sampling.multistep.
MultistepTail`); only its arithmetic is diffusers'.

MixGRPO's ``dpm_step`` (``Tencent-Hunyuan/MixGRPO`` ``fastvideo/utils/sampling_utils.py``, ``dpm_apply_strategy
post``) is DPM-Solver++ on ``alpha = 1 - sigma`` with the data prediction ``x - sigma v``, first order at the last
step and at the second-to-last below 15 steps: diffusers' :class:`~diffusers.DPMSolverMultistepScheduler` with flow
sigmas, ``lower_order_final`` and a final sigma of zero. Their script's settings (``scripts/finetune/
finetune_flux_grpo_MixGRPO.sh``): ``dpm_solver_order=2``, ``dpm_solver_type="midpoint"``.
"""

from __future__ import annotations

import diffusers

#: name: (the diffusers scheduler class, its options)
MULTISTEP_SOLVERS = {
    "dpmsolver++": (diffusers.DPMSolverMultistepScheduler,
                    {"algorithm_type": "dpmsolver++", "solver_order": 2, "solver_type": "midpoint",
                     "prediction_type": "flow_prediction", "use_flow_sigmas": True, "lower_order_final": True,
                     "final_sigmas_type": "zero"}),
}


def multistep_solver(name: str):
    """A fresh diffusers scheduler (no step state) of the solver ``name``.

    >>> type(multistep_solver("dpmsolver++")).__name__, multistep_solver("dpmsolver++").config.solver_order
    ('DPMSolverMultistepScheduler', 2)

    Raises:
        ValueError: an unknown name.
    """
    if name not in MULTISTEP_SOLVERS:
        raise ValueError(f"multistep solver {name!r}: choose one of {list(MULTISTEP_SOLVERS)}")
    cls, options = MULTISTEP_SOLVERS[name]
    return cls(**options)
