"""Every problem of a method's options, as the method raises them when it is built (before any weight loads)."""

from typing import Any

from flowrl.config_nodes import class_at
from flowrl.methods.option_surface import MethodOptionsError


def built_policy(policy: Any) -> Any:
    """``policy`` built where it is a ``{class_path, init_args}`` config (building reads only its configs)."""
    if isinstance(policy, dict):
        return class_at(policy["class_path"])(**policy.get("init_args", {}))
    return policy


def option_problems(cls: type, policy: Any = None, **options: Any) -> list[str]:
    """The problems ``cls(policy, **options)`` raises (``[]``: it builds)."""
    try:
        cls(built_policy(policy), **options)
    except MethodOptionsError as err:
        return err.problems
    return []
