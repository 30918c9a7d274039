"""Reading a parsed config before anything in it is built: the class a ``class_path`` names, a node as plain Python,
and the options a class declares (its ``__init__`` parameters with their defaults).

The checks that run before any weight loads (the CLI's, ``evaluate``'s, a checkpoint's fit to a config) read configs
this way, so that a default is read from the one signature that declares it and never written a second time.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from jsonargparse.typing import import_object

_SKIPPED = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def class_at(path: Any) -> Optional[Any]:
    """The object a dotted ``class_path`` names, imported as jsonargparse imports it (so a config names the same
    class here as in the parser); None when ``path`` is not a dotted path or nothing importable is there.

    >>> class_at("flowrl.methods.FlowGRPO").__name__, class_at("flowrl.methods.NoSuchMethod"), class_at("FlowGRPO")
    ('FlowGRPO', None, None)
    """
    if not isinstance(path, str):
        return None
    try:
        return import_object(path)
    except (ImportError, AttributeError, ValueError):
        return None


def plain(value: Any) -> Any:
    """A parsed config value as plain Python: jsonargparse ``Namespace`` s (nested ``class_path`` / ``init_args``
    nodes) become dicts; anything else is returned as it is."""
    return value.as_dict() if hasattr(value, "as_dict") else value


def as_dict(node: Any) -> dict:
    """A config node (a ``Namespace`` or a dict) as a dict; ``{}`` for a missing or non-mapping node.

    >>> as_dict(None), as_dict({"a": 1}), as_dict("fsdp2")
    ({}, {'a': 1}, {})
    """
    value = plain(node)
    return dict(value) if isinstance(value, dict) else {}


def declared_options(cls: type) -> dict[str, Any]:
    """Every option of ``cls`` with its default: the parameters of each ``__init__`` along its MRO, the most derived
    declaration winning (a method may change a base option's default, e.g. TP-GRPO's ``step_kind: cps``).

    >>> class A:
    ...     def __init__(self, x=1, y=2): ...
    >>> class B(A):
    ...     def __init__(self, z=3, y=5, **kwargs): ...
    >>> declared_options(B)
    {'z': 3, 'y': 5, 'x': 1}
    """
    options: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for name, param in list(inspect.signature(init).parameters.items())[1:]:  # [0] is self
            if param.kind not in _SKIPPED and name not in options:
                options[name] = None if param.default is inspect.Parameter.empty else param.default
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break  # the chain of **kwargs ends here: options further up are not reachable from the config
    return options


def with_defaults(cls: type, init_args: Any) -> dict[str, Any]:
    """A parsed ``init_args`` node of ``cls`` with every option it leaves out at its declared default.

    >>> from flowrl.data import PromptDataModule
    >>> options = with_defaults(PromptDataModule, {"prompts": "p.txt", "group_size": 4})
    >>> options["group_size"], options["num_groups"]  # num_groups: PromptDataModule's default
    (4, 4)
    """
    return {**declared_options(cls), **as_dict(init_args)}
