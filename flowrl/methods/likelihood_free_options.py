"""Option checks of the likelihood-free methods (TDM-R1, DiffusionNFT): pure functions of the parsed config values, run
by the CLI (the methods' ``option_problems``) before any weight loads and again by the methods' ``__init__``; each
problem names the key and a valid value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from flowrl import advantages as adv_lib
from flowrl.losses.nft import ADVANTAGE_MODES
from flowrl.methods.options import base_option_problems, policy_prediction
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.steps import PREDICTIONS, STEPS

TDM_R1_ADAPTERS = ("default", "fake_score", "surrogate")


def _policy_lora(policy: Any) -> Optional[bool]:
    """Whether the policy (an adapter or its parsed config) trains LoRA adapters; None when the config does not say
    (the adapter's default, LoRA, applies)."""
    if isinstance(policy, FlowPolicy):
        return policy.lora is not None
    init_args = policy.get("init_args") if isinstance(policy, dict) else getattr(policy, "init_args", None)
    if hasattr(init_args, "as_dict"):
        init_args = init_args.as_dict()
    if isinstance(init_args, dict) and "lora" in init_args:
        return init_args["lora"] is not None and init_args["lora"] != "None"
    return None


def adapter_policy_problems(policy: Any, method: str) -> list[str]:
    """The policy must train LoRA (named adapters on one backbone) and predict a velocity (the losses are written for
    rectified flow)."""
    problems = []
    if _policy_lora(policy) is False:
        problems.append(f"model.init_args.policy.init_args.lora=null: {method} trains named LoRA adapters on one "
                        "backbone (its reference is the backbone without them); set lora, e.g. {rank: 32, alpha: 64}")
    if (predicts := policy_prediction(policy)) not in (None, "velocity"):
        problems.append(f"model.policy predicts {predicts}: {method}'s losses need a flow (velocity) model such as "
                        "SD3Policy, FluxPolicy or TinyFlowPolicy")
    return problems


def advantage_problems(advantage: str, advantage_options: Optional[dict]) -> list[str]:
    try:
        adv_lib.resolve(advantage, **(advantage_options or {}))
    except ValueError as err:
        return [f"model.advantage: {err}"]
    return []


def _at_least(values: dict[str, Any], low: float, strict: bool, hint: str = "") -> list[str]:
    bad = [k for k, v in values.items() if v is not None and not (v > low if strict else v >= low)]
    return [f"model.{k}={values[k]} must be {'>' if strict else '>='} {low}{hint}" for k in bad]


def tdm_r1_problems(num_steps: int = 4, guidance_scale: float = 1.0, num_train_steps: int = 2,
                    trunc_steps: Optional[int] = None, teacher_guidance: float = 4.5, surrogate_guidance: float = 2.5,
                    tdm_weight: float = 0.3, beta: float = 1e-3, beta_dpo: float = 1.0, clip_range: float = 1e-3,
                    drift_threshold: float = 0.05, surrogate_min_sigma: float = 0.25, reward_min_sigma: float = 0.55,
                    time_shift: float = 3.0, advantage: str = "grpo@flow_grpo",
                    advantage_options: Optional[dict] = None, micro_batch_size: Optional[int] = None,
                    adapter_optimizer_options: Optional[dict] = None, generator_init: Optional[str] = None,
                    policy: Any = None, **base: Any) -> list[str]:
    """Problems with TDM-R1's options and the base's (:class:`~flowrl.methods.tdm_r1.TDMR1`)."""
    problems = base_option_problems(num_steps=num_steps, **base) + adapter_policy_problems(policy, "TDM-R1")
    if guidance_scale != 1.0:
        problems.append(f"model.guidance_scale={guidance_scale}: TDM-R1's generator samples without CFG (its "
                        "CFG-as-reward term trains the guidance into it); use 1.0 and set model.teacher_guidance")
    if not 1 <= num_train_steps <= num_steps:
        problems.append(f"model.num_train_steps={num_train_steps} must be in [1, num_steps={num_steps}] (the code: 2 "
                        "of 4)")
    problems += _at_least({"trunc_steps": trunc_steps, "beta": beta, "drift_threshold": drift_threshold}, 0, False)
    problems += _at_least({"beta_dpo": beta_dpo, "clip_range": clip_range, "time_shift": time_shift}, 0, True)
    problems += _at_least({"teacher_guidance": teacher_guidance, "surrogate_guidance": surrogate_guidance}, 1, False,
                          " (1: no guidance)")
    if not 0 <= tdm_weight <= 1:
        problems.append(f"model.tdm_weight={tdm_weight} must be in [0, 1] (the code: 0.3)")
    for key, value in (("surrogate_min_sigma", surrogate_min_sigma), ("reward_min_sigma", reward_min_sigma)):
        if not 0 <= value < 1:
            problems.append(f"model.{key}={value} must be in [0, 1): a noise level (the code's t_min / 1000)")
    if micro_batch_size is not None and micro_batch_size < 1:
        problems.append(f"model.micro_batch_size={micro_batch_size} must be >= 1 (or null: the whole batch at once)")
    if unknown := sorted(set(adapter_optimizer_options or {}) - set(TDM_R1_ADAPTERS)):
        problems.append(f"model.adapter_optimizer_options has options for {unknown}: TDM-R1's trained adapters are "
                        f"{list(TDM_R1_ADAPTERS)} (default is the generator)")
    if generator_init is not None and not generator_init.startswith("flowrl/") and not Path(generator_init).exists():
        problems.append(f"model.generator_init={generator_init!r} does not exist; give a folder with "
                        "pytorch_lora_weights.safetensors (or the file), or null to start from the backbone")
    return problems + advantage_problems(advantage, advantage_options)


def diffusion_nft_problems(step_kind: Optional[str] = None, noise_level: float = 0.7, nft_beta: float = 1.0,
                           beta: float = 1e-4, advantage_clip: float = 5.0, advantage_mode: str = "all",
                           timestep_fraction: float = 0.99, num_minibatches: int = 1,
                           micro_batch_size: Optional[int] = None, old_decay: Any = None,
                           advantage: str = "grpo@flow_grpo", advantage_options: Optional[dict] = None,
                           policy: Any = None, **base: Any) -> list[str]:
    """Problems with DiffusionNFT's options and the base's (:class:`~flowrl.methods.diffusion_nft.DiffusionNFT`)."""
    problems = base_option_problems(**base) + adapter_policy_problems(policy, "DiffusionNFT")
    velocity_kinds = sorted(k for k, p in PREDICTIONS.items() if p == "velocity" and k in STEPS)
    if step_kind is not None and step_kind not in velocity_kinds:
        problems.append(f"model.step_kind={step_kind!r}: choose a sampler step from {velocity_kinds} (null: the ODE)")
    problems += _at_least({"nft_beta": nft_beta, "advantage_clip": advantage_clip, "noise_level": noise_level}, 0,
                          True) + _at_least({"beta": beta}, 0, False)
    if advantage_mode not in ADVANTAGE_MODES:
        problems.append(f"model.advantage_mode={advantage_mode!r}: choose one of {list(ADVANTAGE_MODES)}")
    if not 0 < timestep_fraction <= 1:
        problems.append(f"model.timestep_fraction={timestep_fraction} must be in (0, 1] (the code: 0.99)")
    if num_minibatches < 1 or (micro_batch_size is not None and micro_batch_size < 1):
        problems.append("model.num_minibatches and model.micro_batch_size must be >= 1 (micro_batch_size may be null)")
    decay = old_decay.as_dict() if hasattr(old_decay, "as_dict") else old_decay
    decay = decay.get("init_args", decay) if isinstance(decay, dict) else vars(decay) if decay is not None else {}
    if decay and not (decay.get("delay", 0) >= 0 and decay.get("rate", 0) >= 0 and 0 <= decay.get("limit", 0) < 1):
        problems.append(f"model.old_decay={decay}: need delay >= 0, rate >= 0 and 0 <= limit < 1 (the code's type 1: "
                        "{delay: 0, rate: 0.001, limit: 0.5})")
    return problems + advantage_problems(advantage, advantage_options)
