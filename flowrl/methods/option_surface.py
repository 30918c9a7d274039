"""A method's options are declared once: each is a parameter of its class's ``__init__``, with its line in that
class's docstring. Everything else derives from the declaration: ``python -m flowrl fit --help`` (jsonargparse reads
the signatures and docstrings), the default a check sees, and the checks themselves.

A class states its rules in a ``check_options(cls, o)`` classmethod over ``o``, the bound value of every option of the
method (its own and its bases'), and returns the problems, each naming the key and the fix. :func:`option_problems`
binds a parsed config's ``init_args`` (or a constructor call's arguments) to the signatures, fills in the defaults and
runs every class's check, base first: the CLI calls it before any weight loads, and ``BaseModule.__init__`` calls it
first thing, before any subclass's ``__init__`` has done more than call it (so before a policy grows an adapter), so
the same rules hold however a method is built. How a config is read before anything is built (the class a
``class_path`` names, the declared defaults): :mod:`flowrl.config_nodes`.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any, Optional

from flowrl.config_nodes import class_at, declared_options, plain
from flowrl.methods.trained_pairs import untrained_problems


def bound_options(cls: type, args: tuple = (), kwargs: Optional[dict] = None) -> tuple[SimpleNamespace, list[str]]:
    """The value of every option of ``cls`` for a call ``cls(*args, **kwargs)`` (or a parsed config's ``init_args``
    as ``kwargs``): the given ones, the defaults elsewhere; and the problems of keys ``cls`` does not declare."""
    declared = declared_options(cls)
    positional = list(declared)[:len(args)]
    given = {**dict(zip(positional, args)), **(kwargs or {})}
    unknown = sorted(set(given) - set(declared))
    problems = [f"model.{key}: {cls.__name__} has no option {key!r}; its options are {sorted(declared)} (`python -m "
                f"flowrl fit --model.help {cls.__module__}.{cls.__name__}` describes each)" for key in unknown]
    return SimpleNamespace(**{k: plain(given.get(k, v)) for k, v in declared.items()}), problems


def option_problems(cls: type, *args: Any, **kwargs: Any) -> list[str]:
    """Every problem with the options of method ``cls`` given as ``cls(*args, **kwargs)`` would take them: unknown
    keys, then each class's ``check_options`` along the MRO, base first, then (when those pass) the rule every method
    shares, that a batch trains some (sample, step) pair (:mod:`flowrl.methods.trained_pairs`). Model-free and
    weight-free."""
    options, problems = bound_options(cls, args, kwargs)
    for klass in reversed(cls.__mro__):
        check = klass.__dict__.get("check_options")
        if check is not None:
            problems += check.__func__(cls, options)
    if not problems and hasattr(cls, "trained_step_mask"):  # one rule for every method, on options known sound
        problems += untrained_problems(cls, options, declared_options(cls))
    return problems


def checked_options(cls: type, args: tuple, kwargs: dict) -> SimpleNamespace:
    """The bound options of ``cls(*args, **kwargs)``; :func:`option_problems` raised together as one ``ValueError``."""
    if problems := option_problems(cls, *args, **kwargs):
        raise ValueError("invalid method settings:\n  " + "\n  ".join(problems))
    return bound_options(cls, args, kwargs)[0]


def at_least(o: SimpleNamespace, low: float, keys: tuple[str, ...], strict: bool = False, hint: str = "") -> list[str]:
    """``model.<key>=<value> must be >= low`` (or ``> low``) for each of ``keys`` whose value is set and below.

    >>> at_least(SimpleNamespace(a=0, b=None, c=3), 1, ("a", "b", "c"), hint=" (or null)")
    ['model.a=0 must be >= 1 (or null)']
    """
    values = {key: getattr(o, key) for key in keys}
    bad = [k for k, v in values.items() if v is not None and not (v > low if strict else v >= low)]
    return [f"model.{k}={values[k]} must be {'>' if strict else '>='} {low}{hint}" for k in bad]


def policy_prediction(policy: Any) -> Optional[str]:
    """What a policy's network predicts (``FlowPolicy.prediction``), from the adapter or its parsed config.

    >>> policy_prediction({"class_path": "flowrl.policies.TinyFlowPolicy"}), policy_prediction(None)
    ('velocity', None)
    """
    if hasattr(policy, "prediction") and not isinstance(policy, dict):
        return policy.prediction
    return getattr(policy_class(policy), "prediction", None)


def policy_class(policy: Any) -> Optional[type]:
    """The class a parsed policy config names (None: not a config, or no importable dotted ``class_path``)."""
    return class_at(policy.get("class_path")) if isinstance(policy, dict) else None


def policy_guidance(policy: Any) -> Optional[str]:
    """How the policy guides (``FlowPolicy.guidance_kind``: ``cfg``, ``embedded`` or ``none``), from the adapter or
    its parsed config (the model folder's configs, no weights); None when unknown.

    >>> policy_guidance({"class_path": "flowrl.policies.TinyFlowPolicy"}), policy_guidance(None)
    ('cfg', None)
    """
    if hasattr(policy, "guidance_kind") and not isinstance(policy, dict):
        return policy.guidance_kind
    cls = policy_class(policy)
    if not hasattr(cls, "guidance_kind_of"):
        return None
    declared = inspect.signature(cls.__init__).parameters.get("model")
    model = (plain(policy.get("init_args")) or {}).get("model", declared.default if declared else None)
    return cls.guidance_kind_of(model if isinstance(model, str) else None)


def policy_trains_lora(policy: Any) -> Optional[bool]:
    """Whether the policy (an adapter or its parsed config) trains LoRA adapters; None when the config does not say
    (the adapter's default, LoRA, applies).

    >>> policy_trains_lora({"init_args": {"lora": None}}), policy_trains_lora({"init_args": {}})
    (False, None)
    """
    if hasattr(policy, "lora") and not isinstance(policy, dict):
        return policy.lora is not None
    init_args = plain(policy.get("init_args")) if isinstance(policy, dict) else None
    if isinstance(init_args, dict) and "lora" in init_args:
        return init_args["lora"] is not None and init_args["lora"] != "None"
    return None


def optimizer_problems(optimizer: Any) -> list[str]:
    """Problems with the optimizer's parsed ``init_args`` (a learning rate that is not positive), found before the
    optimizer (or any weight) is built; an already built optimizer factory is not inspected.

    >>> optimizer_problems({"class_path": "torch.optim.AdamW", "init_args": {"lr": -1e-3}})  # doctest: +ELLIPSIS
    ['model.optimizer.init_args.lr=-0.001 must be > 0 ...']
    """
    init_args = plain(optimizer.get("init_args")) if isinstance(optimizer, dict) else None
    lr = init_args.get("lr") if isinstance(init_args, dict) else None
    if isinstance(lr, (int, float)) and not lr > 0:
        return [f"model.optimizer.init_args.lr={lr} must be > 0 (e.g. 3.0e-4 for LoRA, 1.0e-5 for full fine-tuning)"]
    return []


def named_adapter_problems(policy: Any, method: str) -> list[str]:
    """A method on named LoRA adapters (TDM-R1, DiffusionNFT) needs a policy that trains LoRA (the reference is the
    backbone without adapters) and predicts a velocity (their losses are written for rectified flow)."""
    problems = []
    if policy_trains_lora(policy) is False:
        problems.append(f"model.init_args.policy.init_args.lora=null: {method} trains named LoRA adapters on one "
                        "backbone (its reference is the backbone without them); set lora, e.g. {rank: 32, alpha: 64}")
    if (predicts := policy_prediction(policy)) not in (None, "velocity"):
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

    >>> guidance_scale_problems({"class_path": "flowrl.policies.TinyFlowPolicy"}, 4.5)
    []
    >>> guidance_scale_problems({"class_path": "flowrl.policies.TinyFlowPolicy"}, 0.0)[0][:60]
    'model.guidance_scale=0.0: below 1, classifier-free guidance '
    """
    kind = policy_guidance(policy)
    if kind == "none" and guidance_scale != 1.0:
        return [f"{key}={guidance_scale}: the policy's model is step-distilled without guidance (no unconditional "
                "side, no guidance input), so guidance would do nothing; set it to 1.0"]
    if guidance_scale >= 1.0:
        return []
    cls = policy_class(policy) or type(policy)
    convention = f" ({PIPELINE_SCALES[cls.__name__]})" if cls.__name__ in PIPELINE_SCALES else ""
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
    kind = policy_guidance(policy)
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

    >>> policy_guidance_scales({"init_args": {"guidance_scale_2": 0.0}})
    {'model.init_args.policy.init_args.guidance_scale_2': 0.0}
    """
    init_args = (plain(policy.get("init_args")) if isinstance(policy, dict)
                 else {"guidance_scale_2": getattr(policy, "guidance_scale_2", None)})
    value = init_args.get("guidance_scale_2") if isinstance(init_args, dict) else None
    return {"model.init_args.policy.init_args.guidance_scale_2": value} if isinstance(value, (int, float)) else {}
