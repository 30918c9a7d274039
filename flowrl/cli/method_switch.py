"""Switching a config's method by one line: ``--model.class_path=flowrl.methods.TreeRPO`` after a ``--config`` that
names another method, or an edited ``class_path`` in the YAML.

jsonargparse carries the earlier class's ``init_args`` over to the new class one key at a time, which turns nested
dataclass options (the policy's ``lora``) into errors about their types. Before LightningCLI parses anything, flowrl
reads the configs' ``model`` section itself: a switch becomes one config layer holding the new class and the
config's ``init_args`` (so the rest of the command line still overrides them), and ``init_args`` keys the method
does not declare are named in one error with the fix, for a switched method and a hand-edited YAML alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from flowrl.config_nodes import class_at, declared_options


def _flag(arg: str, args: list[str], i: int) -> tuple[Optional[str], Optional[str], int]:
    """``(key, value, consumed)`` of the option at ``args[i]`` (``--key=value`` or ``--key value``)."""
    if not arg.startswith("-"):
        return None, None, 1
    key, eq, value = arg.partition("=")
    if eq:
        return key, value, 1
    return key, (args[i + 1] if i + 1 < len(args) else None), 2


def _model_of(source: str) -> dict:
    """The ``model`` section of a config file or inline YAML (empty when it has none or is not readable)."""
    path = Path(source).expanduser()
    try:
        data = yaml.safe_load(path.read_text() if path.is_file() else source)
    except (OSError, yaml.YAMLError):
        return {}
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, dict) else {}


def method_switch(args: list[str]) -> list[str]:
    """``args`` with a method switch turned into one config layer (see the module docstring).

    Raises:
        SystemExit: the configs' ``model.init_args`` set options the (new) method does not declare.
    """
    model: dict[str, Any] = {}
    out, i, switched = [], 0, None
    while i < len(args):
        key, value, used = _flag(args[i], args, i)
        if key in ("--config", "-c") and value is not None:
            layer = _model_of(value)
            if layer.get("class_path") and layer.get("class_path") != model.get("class_path"):
                model = {"class_path": layer["class_path"], "init_args": {}}
            model.setdefault("init_args", {}).update(layer.get("init_args") or {})
        if key in ("--model.class_path", "--model") and value and "." in value and not value.startswith("{"):
            switched = value
            out.append(("--config", value))  # a placeholder, filled in below with the config's init_args
            i += used
            continue
        out.append(args[i:i + used])
        i += used
    if switched is not None:
        model = {"class_path": switched, "init_args": model.get("init_args", {})}
    if problems := unknown_option_problems(model, switched is not None):
        raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
    layer = yaml.safe_dump({"model": model}, default_flow_style=True, width=10**9).strip()
    # the earlier class's parsed namespace is dropped first: a fresh class_path is then parsed whole
    switch = ["--config", "{model: null}", "--config", layer]
    return [x for part in out for x in (switch if isinstance(part, tuple) else part)]


def unknown_option_problems(model: dict, switched: bool = False) -> list[str]:
    """``model.init_args`` keys the method named by ``model.class_path`` does not declare, in one problem.

    >>> problems = unknown_option_problems({"class_path": "flowrl.methods.TreeRPO",
    ...                                     "init_args": {"timestep_fraction": 0.5, "num_steps": 6}})
    >>> problems[0][:82]
    'model.class_path=flowrl.methods.TreeRPO has no option timestep_fraction, which the'
    """
    cls = class_at(model.get("class_path"))
    if cls is None or not hasattr(cls, "check_options"):
        return []  # not a flowrl method (or not importable): the parser names it
    lacking = sorted(set(model.get("init_args") or {}) - set(declared_options(cls)))
    if not lacking:
        return []
    how = ("switched to by --model.class_path" if switched else "named by the config")
    return [f"model.class_path={model['class_path']} has no option {', '.join(lacking)}, which the config sets under "
            f"model.init_args (the method {how}); remove {'them' if len(lacking) > 1 else 'it'} from a copy of the "
            f"config, or see every option with `python -m flowrl fit --model.help {model['class_path']}`"]
