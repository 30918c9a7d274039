"""Whether a checkpoint was trained on the policy (model family) a config builds, known before anything loads.

Adapter names and ranks alone do not tell a Wan checkpoint from a Flux one: both hold a rank-32 ``default`` adapter,
and the load then fails with every key missing and every key extra. A checkpoint records its policy's class
(``flowrl_policy``, written by every method's ``on_save_checkpoint``; an older one: the run's ``config.yaml`` beside
it says), and its LoRA weights name the modules they adapt, which the config's LoRA targets must name too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from flowrl.checkpoints.paths import run_config
from flowrl.config_nodes import as_dict, class_at


def method_path(cls: type | object | str, package: str = "flowrl.methods") -> str:
    """The class path a config names ``cls`` (a class, a built object, or a class path already) by:
    ``flowrl.methods.FlowGRPO`` for the classes ``package`` exports (flowrl's methods by default;
    ``flowrl.policies`` for a policy), the defining module's path for any other class.

    ``package`` is looked up among the loaded modules, not imported: ``flowrl.methods`` is a floor above this one,
    and importing one of its classes has loaded it.

    >>> import json
    >>> method_path(json.JSONDecoder), method_path("my_lab.MyGRPO")
    ('json.decoder.JSONDecoder', 'my_lab.MyGRPO')
    """
    if isinstance(cls, str):
        return cls
    cls = cls if isinstance(cls, type) else type(cls)  # a built module names its class
    if getattr(sys.modules.get(package), cls.__name__, None) is cls:
        return f"{package}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def saved_policy(ckpt: str | Path, recorded: Optional[str]) -> tuple[Optional[str], str]:
    """The class path of the policy that wrote ``ckpt`` and where that is read (None: not known)."""
    if recorded:
        return recorded, "recorded in the checkpoint"
    if (config := run_config(Path(ckpt))) is None:
        return None, ""
    import yaml

    try:
        node = yaml.safe_load(config.read_text()) or {}
        path = node.get("model", {}).get("init_args", {}).get("policy", {}).get("class_path")
    except (OSError, yaml.YAMLError, AttributeError):
        return None, ""
    return (path, f"its run's {config}") if isinstance(path, str) else (None, "")


def lora_targets(policy: dict) -> tuple[str, ...]:
    """The module names a parsed policy config's LoRA adapts (its ``lora.target_modules``, else its class's
    default); empty when unknown (full fine-tuning, or targets chosen when the model loads).

    >>> lora_targets({"class_path": "flowrl.policies.TinyFlowPolicy", "init_args": {"lora": {"rank": 4}}})[:2]
    ('attn.to_q', 'attn.to_k')
    """
    lora = as_dict(as_dict(policy.get("init_args")).get("lora"))
    if lora.get("target_modules"):
        return tuple(lora["target_modules"])
    return tuple(getattr(class_at(policy.get("class_path")), "default_lora_targets", ()) or ())


def untargeted_modules(shapes: dict[str, Any], targets: tuple[str, ...]) -> list[str]:
    """The modules that hold LoRA weights in ``shapes`` (a state dict's keys) but that none of ``targets`` names
    (peft's rule: the module's name is the target or ends with ``.`` + the target).

    >>> untargeted_modules({"policy.denoiser.blocks.0.attention.to_q.lora_A.default.weight": (4, 8)},
    ...                    ("attn.to_q", "attn.to_k"))
    ['policy.denoiser.blocks.0.attention.to_q']
    """
    modules = {key.split(".lora_A.")[0] for key in shapes if ".lora_A." in key}
    return sorted(m for m in modules if not any(m == t or m.endswith("." + t) for t in targets))


def policy_family(policy: Any) -> tuple[Optional[type], Optional[str], tuple[str, ...]]:
    """``(class, class path as a config names it, LoRA targets)`` of a built policy or a parsed policy config
    ``{class_path, init_args}``.

    >>> policy_family({"class_path": "flowrl.policies.TinyFlowPolicy"})[0].__name__
    'TinyFlowPolicy'
    """
    if isinstance(policy, dict) or hasattr(policy, "as_dict") or policy is None:
        policy = as_dict(policy)
        return class_at(policy.get("class_path")), policy.get("class_path"), lora_targets(policy)
    return type(policy), method_path(policy, "flowrl.policies"), tuple(policy.lora_targets or ())


def family_problem(ckpt: str | Path, shapes: dict[str, Any], recorded: Optional[str], policy: Any) -> Optional[str]:
    """Why ``ckpt`` (its ``shapes`` and recorded policy class) was not trained on the family of ``policy`` (built,
    or a parsed policy config), naming both policies (None: it was, or nothing says otherwise)."""
    wanted, path, targets = policy_family(policy)
    saved, where = saved_policy(ckpt, recorded)
    if wanted is not None and (theirs := class_at(saved)) is not None and theirs is not wanted:
        return (f"ckpt_path={str(ckpt)!r} holds the weights of a {saved} policy ({where}); the config builds "
                f"{path} (model.init_args.policy.class_path), and one policy's weights do not load into another's")
    stray = untargeted_modules(shapes, targets) if targets else []
    if stray:
        return (f"ckpt_path={str(ckpt)!r} holds LoRA weights on {len(stray)} modules that the config's {path} LoRA "
                f"targets ({', '.join(targets)}) do not name, e.g. {stray[0]}: a checkpoint of "
                f"{saved or 'another model family'} or of other lora.target_modules")
    return None
