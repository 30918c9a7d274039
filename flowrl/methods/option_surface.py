"""A method's options are declared once: each is a parameter of its class's ``__init__``, with its line in that
class's docstring, and each is an attribute of the same name, set once in ``__init__``. Everything else derives from
the declaration: ``python -m flowrl fit --help`` (jsonargparse reads the signatures and docstrings) and the checks.

A class states its rules in ``problems(self)``, chained through ``super().problems()`` (base first), each problem
naming the key and the fix; :meth:`~flowrl.methods.base.BaseModule.all_problems` adds the rule every method shares
(a batch trains some (sample, step) pair, :mod:`flowrl.methods.trained_pairs`), and a method raises them together
(:class:`MethodOptionsError`) when its most derived ``__init__`` returns, before any weight loads. The helpers here
read the built policy (its configs only: building one loads no weight).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class MethodOptionsError(ValueError):
    """Every problem of a method's options, raised together (``problems``: each a line naming its key and fix)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid method settings:\n  " + "\n  ".join(self.problems))


def at_least(o: SimpleNamespace, low: float, keys: tuple[str, ...], strict: bool = False, hint: str = "") -> list[str]:
    """``model.<key>=<value> must be >= low`` (or ``> low``) for each of ``keys`` whose value is set and below.

    >>> at_least(SimpleNamespace(a=0, b=None, c=3), 1, ("a", "b", "c"), hint=" (or null)")
    ['model.a=0 must be >= 1 (or null)']
    """
    values = {key: getattr(o, key) for key in keys}
    bad = [k for k, v in values.items() if v is not None and not (v > low if strict else v >= low)]
    return [f"model.{k}={values[k]} must be {'>' if strict else '>='} {low}{hint}" for k in bad]


def optimizer_problems(optimizer: Any) -> list[str]:
    """Problems with the optimizer factory's learning rate (one that is not positive), read off the factory the parser
    built (a ``functools.partial`` with its ``init_args`` as keywords), before the optimizer (or any weight) exists.

    >>> import functools, torch
    >>> optimizer_problems(functools.partial(torch.optim.AdamW, lr=-1e-3))  # doctest: +ELLIPSIS
    ['model.optimizer.init_args.lr=-0.001 must be > 0 ...']
    """
    lr = getattr(optimizer, "keywords", {}).get("lr")
    if isinstance(lr, (int, float)) and not lr > 0:
        return [f"model.optimizer.init_args.lr={lr} must be > 0 (e.g. 3.0e-4 for LoRA, 1.0e-5 for full fine-tuning)"]
    return []


def named_adapter_problems(policy: Any, method: str) -> list[str]:
    """A method on named LoRA adapters (TDM-R1, DiffusionNFT) needs a policy that trains LoRA (the reference is the
    backbone without adapters) and predicts a velocity (their losses are written for rectified flow)."""
    problems = []
    if policy is not None and hasattr(policy, "lora") and policy.lora in (None, "None"):
        problems.append(f"model.init_args.policy.init_args.lora=null: {method} trains named LoRA adapters on one "
                        "backbone (its reference is the backbone without them); set lora, e.g. {rank: 32, alpha: 64}")
    if (predicts := getattr(policy, "prediction", None)) not in (None, "velocity"):
        problems.append(f"model.policy predicts {predicts}: {method}'s losses need a flow (velocity) model such as "
                        "SD3Policy, FluxPolicy or TinyFlowPolicy")
    return problems


#: How each family's diffusers pipeline reads its guidance scale, where it differs from the CFG families' ``w`` (SD3,
#: SD1.5, Wan, Qwen-Image's ``true_cfg_scale``, FLUX.2 [klein] base: ``v_u + w (v_c - v_u)``, guidance on above 1).
#: ``ZImagePipeline`` combines ``pos + g (pos - neg)`` and guides above 0: flowrl's scale is its ``g + 1``.
PIPELINE_SCALES = {"ZImagePolicy": "ZImagePipeline's guidance_scale is this minus 1 (its 0, no guidance, is 1 here)"}


def guidance_scale_problems(policy: Any, guidance_scale: float, key: str = "model.guidance_scale") -> list[str]:
    """A guidance scale that means something other than what the family's pipeline means by it, refused rather than
    run: below 1 (the pipelines guide only above 1, 1 disables guidance; 0 would sample without the prompt, below 0
    against it, and the run would learn nothing while exiting 0), and other than 1 on a model without guidance (a
    step-distilled FLUX.2 [klein]: no unconditional side, no guidance input), where it would do nothing.

    >>> guidance_scale_problems(None, 4.5)
    []
    >>> guidance_scale_problems(None, 0.0)[0][:60]
    'model.guidance_scale=0.0: below 1, classifier-free guidance '
    """
    kind = getattr(policy, "guidance_kind", None)
    if kind == "none" and guidance_scale != 1.0:
        return [f"{key}={guidance_scale}: the policy's model is step-distilled without guidance (no unconditional "
                "side, no guidance input), so guidance would do nothing; set it to 1.0"]
    if guidance_scale >= 1.0:
        return []
    name = type(policy).__name__
    convention = f" ({PIPELINE_SCALES[name]})" if name in PIPELINE_SCALES else ""
    if kind == "embedded":
        meaning = ("the model's distilled guidance input was trained on the pipeline's scales, which guide above 1; "
                   "below 1 it is outside them")
    else:
        meaning = ("classifier-free guidance v_u + w (v_c - v_u) moves away from the prompt (0: the prompt ignored, "
                   "below 0: against it), so the rewards could not improve")
    return [f"{key}={guidance_scale}: below 1, {meaning}; the pipelines guide above 1 and 1 disables guidance"
            f"{convention}: use 1.0 (no guidance) or above, e.g. 4.5"]


def guidance_distillation_problems(policy: Any, teacher_guidance: float, surrogate_guidance: float) -> list[str]:
    """TDM-R1 distils classifier-free guidance into a few-step generator: a guidance-distilled model (guidance an
    input of the transformer) has no CFG pair to distil; a step-distilled one without guidance trains with its CFG
    terms at 1 (the teacher's conditional velocity and the surrogate alone)."""
    kind = getattr(policy, "guidance_kind", None)
    if kind == "embedded":
        return ["model.policy: its model is guidance-distilled (FLUX.1 [dev], FLUX.1 Kontext [dev], FLUX.2 [dev]: "
                "guidance is an input of the transformer, with no unconditional side), and TDM-R1 distils "
                "classifier-free guidance into a few-step generator; use a model with CFG (SD3.5, Qwen-Image, "
                "Z-Image, FLUX.2 [klein] base, Qwen-Image-Edit, Wan) or a step-distilled FLUX.2 [klein] with "
                "teacher_guidance and surrogate_guidance 1"]
    if kind == "none" and (teacher_guidance != 1.0 or surrogate_guidance != 1.0):
        return [f"model.teacher_guidance={teacher_guidance} / surrogate_guidance={surrogate_guidance}: the policy's "
                "model is step-distilled without an unconditional side, so there is no CFG to form; set both to 1.0"]
    return (guidance_scale_problems(policy, teacher_guidance, "model.teacher_guidance")
            + guidance_scale_problems(policy, surrogate_guidance, "model.surrogate_guidance"))


def guidance_gate_problems(guidance_scale: float, key: str, scale: float) -> list[str]:
    """``WanPipeline`` guides only when ``guidance_scale > 1``: at 1 it runs no classifier-free guidance at all, its
    ``guidance_scale_2`` ignored. A second expert's scale above 1 under a first scale of 1 would guide the low-noise
    steps where the pipeline guides none, so it is refused rather than run.

    >>> guidance_gate_problems(1.0, "policy.guidance_scale_2", 3.0)[0][:58]
    'model.guidance_scale=1.0 with policy.guidance_scale_2=3.0:'
    >>> guidance_gate_problems(4.0, "policy.guidance_scale_2", 3.0), guidance_gate_problems(1.0, "k", 1.0)
    ([], [])
    """
    if guidance_scale > 1.0 or scale <= 1.0:
        return []
    return [f"model.guidance_scale={guidance_scale} with {key}={scale}: WanPipeline runs no guidance at all when "
            "guidance_scale <= 1 (guidance_scale_2 is then ignored), where this would guide the low-noise expert's "
            "steps alone; set guidance_scale above 1 to guide both experts, or guidance_scale_2 to 1 (or null) for "
            "no guidance"]


def policy_guidance_scales(policy: Any) -> dict[str, float]:
    """Guidance scales the policy itself takes (Wan 2.2's ``guidance_scale_2``), by their config key, where set.

    >>> policy_guidance_scales(SimpleNamespace(guidance_scale_2=0.0))
    {'model.init_args.policy.init_args.guidance_scale_2': 0.0}
    """
    value = getattr(policy, "guidance_scale_2", None)
    return {"model.init_args.policy.init_args.guidance_scale_2": value} if isinstance(value, (int, float)) else {}
