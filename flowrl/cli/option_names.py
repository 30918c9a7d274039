"""Option names on the command line that no class declares (``--data.gruop_size=8``), found before LightningCLI parses
them: jsonargparse answers such a key with its whole usage (62 lines for ``fit``) or, inside the method's
``init_args``, with a dump of the Union it could not match. Here each becomes one problem naming the nearest declared
option (difflib), and the option is taken out of the command line so that the parse goes on and every other problem
of the command is reported with it, before anything is built.

Checked: ``--data.K``, ``--trainer.K``, ``--model.K`` / ``--model.init_args.K`` (the method in effect, after a
switch) and ``--model.init_args.policy.init_args.K`` (the config's policy). Deeper keys (a callback's, the
optimizer's ``init_args``) are left to the parser, which names them itself.
"""

from __future__ import annotations

import difflib
from typing import Optional

from flowrl.config_nodes import class_at, declared_options

#: keys of a class node that are not options of the class
_NODE_KEYS = {"class_path", "init_args", "dict_kwargs", "help"}


def _declared(section: str, model: dict) -> Optional[tuple[str, dict]]:
    """``(what, options)`` of a checked section (``data``, ``trainer``, ``model``, ``policy``); None: not checked."""
    if section == "data":
        from flowrl.data import PromptDataModule

        return "the data module (flowrl.data.PromptDataModule)", declared_options(PromptDataModule)
    if section == "trainer":
        from lightning.pytorch import Trainer

        return "Lightning's Trainer", declared_options(Trainer)
    path = model.get("class_path") if section == "model" else (
        ((model.get("init_args") or {}).get("policy") or {}).get("class_path")
        if isinstance((model.get("init_args") or {}).get("policy"), dict) else None)
    cls = class_at(path)
    if cls is None or (section == "model" and not hasattr(cls, "all_problems")):
        return None  # not importable (the parser names it) or not a flowrl method
    return path, declared_options(cls)


def _split(key: str) -> Optional[tuple[str, str, str]]:
    """``(section, prefix, name)`` of a checked dotted key; None for any other key.

    >>> _split("--model.init_args.policy.init_args.lorra"), _split("--data.group_size"), _split("--trainer.logger.a")
    (('policy', 'model.init_args.policy.init_args.', 'lorra'), ('data', 'data.', 'group_size'), ('trainer', \
'trainer.', 'logger'))
    >>> _split("--model.init_args.optimizer.init_args.lr"), _split("--ckpt_path")
    (('model', 'model.init_args.', 'optimizer'), None)
    """
    parts = key.lstrip("-").rstrip("+").split(".")
    if len(parts) < 2 or parts[0] not in ("data", "trainer", "model"):
        return None
    if parts[0] != "model":
        return parts[0], f"{parts[0]}.", parts[1]
    rest = parts[2:] if parts[1] == "init_args" else parts[1:]
    if not rest:
        return None
    if rest[0] == "policy" and len(rest) > 1:
        inner = rest[2:] if rest[1] == "init_args" else rest[1:]
        return ("policy", "model.init_args.policy.init_args.", inner[0]) if inner else None
    return "model", "model.init_args.", rest[0]


def unknown_options(args: list[str], model: dict) -> tuple[list[str], list[str]]:
    """``args`` without the options no class declares, and one problem for each, naming the nearest declared one.

    Args:
        args: the command line (after :func:`flowrl.cli.method_switch.method_switch`).
        model: the ``model`` section in effect (its ``class_path`` and the config's ``init_args``).

    >>> unknown_options(["fit", "--data.gruop_size=8", "--trainer.max_steps", "2"], {})  # doctest: +ELLIPSIS
    (['fit', '--trainer.max_steps', '2'], ['--data.gruop_size=8: ... has no option gruop_size; did you mean \
--data.group_size?'])
    >>> tiny = {"class_path": "flowrl.methods.FlowGRPO", "init_args": {"policy": {"class_path":
    ...                                                                            "flowrl.policies.TinyFlowPolicy"}}}
    >>> unknown_options(["--model.init_args.policy.init_args.max_sequence_length=64"], tiny)[1][0][:78]
    '--model.init_args.policy.init_args.max_sequence_length=64: flowrl.policies.Tin'
    >>> unknown_options(["--model.init_args.policy.class_path=flowrl.policies.SD3Policy",
    ...                  "--model.init_args.policy.init_args.max_sequence_length=64"], tiny)[1]
    []
    """
    out, problems, i = [], [], 0
    if any(a.startswith(("--model.init_args.policy=", "--model.init_args.policy.class_path")) for a in args):
        model = {**model, "init_args": {k: v for k, v in (model.get("init_args") or {}).items() if k != "policy"}}
    while i < len(args):  # (a policy named on the command line: its options are left to the parser)
        arg = args[i]
        key, eq, _ = arg.partition("=")
        used = 1 if eq or not key.startswith("--") or i + 1 >= len(args) or args[i + 1].startswith("--") else 2
        problem = _problem(key, arg if eq else " ".join(args[i:i + used]), model) if key.startswith("--") else None
        if problem is None:
            out += args[i:i + used]
        else:
            problems.append(problem)
        i += used
    return out, problems


def _problem(key: str, given: str, model: dict) -> Optional[str]:
    split = _split(key)
    if split is None or split[2] in _NODE_KEYS:
        return None
    section, prefix, name = split
    declared = _declared(section, model)
    if declared is None or name in declared[1]:
        return None
    what, options = declared
    near = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    every = f"--model.help {what}" if section in ("model", "policy") else "--help"
    fix = f"did you mean --{prefix}{near[0]}?" if near else f"`python -m flowrl fit {every}` lists every option"
    return f"{given}: {what} has no option {name}; {fix}"
