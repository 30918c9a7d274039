"""Switching a config's method by one line: ``--model.class_path=flowrl.methods.TreeRPO`` after a ``--config`` that
names another method, or an edited ``class_path`` in the YAML.

jsonargparse carries the earlier class's ``init_args`` over to the new class one key at a time, which turns nested
dataclass options (the policy's ``lora``) into errors about their types. Before LightningCLI parses anything, flowrl
reads the configs' ``model`` section itself: a switch becomes one config layer holding the new class and the
config's ``init_args``, followed by every other ``--model.*`` option of the command line, wherever it stood (an option
given before the switch would otherwise be reset with the earlier class), so the command line still overrides them.

A config written for one method sets options another lacks (Flow-GRPO's ``timestep_fraction`` on a tree method, the
PPO options on TDM-R1), or inherits but refuses (PODS' ``downsample_to`` on a method that credits steps or tree
nodes): on a switch those the config files set are left out of the layer and named in one notice,
since the user asked for the other method and not for them; the same option typed on the command line is still an
error (:mod:`flowrl.cli.option_names`). A hand-edited ``class_path`` whose own config sets options it lacks is an
error too: nothing was switched, so the config is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Optional

import yaml

from flowrl.config_nodes import class_at, declared_options

_SWITCH = object()  # where the switch stood in the command line: the layer and the moved options go there


class Switch(NamedTuple):
    """The command line with the switch turned into config layers, the ``model`` section in effect (the class and
    every ``init_args`` key the config files set), and the notice of the config options dropped (None: none)."""

    args: list[str]
    model: dict
    notice: Optional[str]


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


def _is_switch(key: Optional[str], value: Optional[str]) -> bool:
    """``--model.class_path=a.B`` or ``--model=a.B`` (not a config file nor an inline mapping)."""
    return (key in ("--model.class_path", "--model") and bool(value) and "." in value and not value.startswith("{")
            and not value.endswith((".yaml", ".yml", ".json")))


def method_switch(args: list[str]) -> Switch:
    """``args`` with a method switch turned into one config layer (see the module docstring).

    >>> switch = method_switch(["fit", "--model.init_args.num_steps=4", "--model.class_path=flowrl.methods.TreeRPO",
    ...                         "--trainer.max_steps=2"])
    >>> switch.args  # the option given before the switch comes after its layer, so it still holds
    ['fit', '--config', '{model: null}', '--config', '{model: {class_path: flowrl.methods.TreeRPO, init_args: {}}}', \
'--model.init_args.num_steps=4', '--trainer.max_steps=2']

    Raises:
        SystemExit: without a switch, the configs' ``model.init_args`` set options their own method does not declare.
    """
    model: dict[str, Any] = {}
    parts: list = []  # the command line in parts: one option (with its value) each, or _SWITCH
    switched = None
    i = 0
    while i < len(args):
        key, value, used = _flag(args[i], args, i)
        if key in ("--config", "-c") and value is not None:
            layer = _model_of(value)
            if layer.get("class_path") and layer.get("class_path") != model.get("class_path"):
                model = {"class_path": layer["class_path"], "init_args": {}}
            model.setdefault("init_args", {}).update(layer.get("init_args") or {})
        if _is_switch(key, value):
            switched = value
            parts = [p for p in parts if p is not _SWITCH] + [_SWITCH]  # the last switch wins
        else:
            parts.append(args[i:i + used])
        i += used
    if switched is None:
        if problems := unknown_option_problems(model):
            raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
        return Switch(list(args), model, None)
    model, dropped = {"class_path": switched, "init_args": dict(model.get("init_args") or {})}, []
    cls = class_at(switched)
    if cls is not None and hasattr(cls, "all_problems"):  # a flowrl method: the parser names anything else
        refused = cls.inapplicable_options() if hasattr(cls, "inapplicable_options") else ()
        dropped = sorted(set(model["init_args"]) - (set(declared_options(cls)) - set(refused)))
        for key in dropped:
            del model["init_args"][key]
    layer = yaml.safe_dump({"model": model}, default_flow_style=True, width=10**9).strip()
    # the earlier class's parsed namespace is dropped first: a fresh class_path is then parsed whole
    switch = [["--config", "{model: null}", "--config", layer]]
    at = parts.index(_SWITCH)
    before = [p for p in parts[:at] if not _is_model_option(p)]
    moved = [p for p in parts[:at] if _is_model_option(p)]  # after the layer, in their order: they still hold
    out = before + switch + moved + parts[at + 1:]
    return Switch([x for part in out for x in part], model, dropped_notice(switched, dropped))


def _is_model_option(part: list[str]) -> bool:
    return part[0].startswith("--model.") or (part[0].startswith("--model=") and part[0] != "--model=")


def dropped_notice(class_path: str, dropped: list[str]) -> Optional[str]:
    """The one line that names the config options a switched-to method lacks (None: it has every one).

    >>> dropped_notice("flowrl.methods.TreeRPO", ["timestep_fraction"])  # doctest: +ELLIPSIS
    'flowrl: --model.class_path=flowrl.methods.TreeRPO has no option timestep_fraction, which the config sets: left out...'
    """
    if not dropped:
        return None
    return (f"flowrl: --model.class_path={class_path} has no option {', '.join(dropped)}, which the config sets: left "
            f"out of this run (given on the command line, {'they are' if len(dropped) > 1 else 'it is'} an error)")


def unknown_option_problems(model: dict) -> list[str]:
    """``model.init_args`` keys the method named by ``model.class_path`` (the config's own, not a switch) does not
    declare, in one problem.

    >>> problems = unknown_option_problems({"class_path": "flowrl.methods.TreeRPO",
    ...                                     "init_args": {"timestep_fraction": 0.5, "num_steps": 6}})
    >>> problems[0][:82]
    'model.class_path=flowrl.methods.TreeRPO has no option timestep_fraction, which the'
    """
    cls = class_at(model.get("class_path"))
    if cls is None or not hasattr(cls, "all_problems"):
        return []  # not a flowrl method (or not importable): the parser names it
    lacking = sorted(set(model.get("init_args") or {}) - set(declared_options(cls)))
    if not lacking:
        return []
    return [f"model.class_path={model['class_path']} has no option {', '.join(lacking)}, which the config sets under "
            f"model.init_args (the method named by the config); remove {'them' if len(lacking) > 1 else 'it'} from "
            f"the config, or see every option with `python -m flowrl fit --model.help {model['class_path']}`"]
