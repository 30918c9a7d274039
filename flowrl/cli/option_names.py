"""Option names on the command line that no class declares (``--data.gruop_size=8``), found before LightningCLI parses
them: jsonargparse answers such a key with its whole usage (62 lines for ``fit``) or, inside the method's
``init_args``, with a dump of the Union it could not match. Here each becomes one problem naming the nearest declared
option (difflib), and the option is taken out of the command line so that the parse goes on and every other problem
of the command is reported with it, before anything is built.

Checked: a subcommand's own keys (``--ckpt_path``, ``--seed_everything``: a misspelt ``--ckpt_pth`` is one line, not
the usage), ``--data.K``, ``--trainer.K``, ``--model.K`` / ``--model.init_args.K`` (the method in effect, after a
switch) and ``--model.init_args.policy.init_args.K`` (the config's policy). Deeper keys (a callback's, the
optimizer's ``init_args``) are left to the parser, which names them itself.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Optional

from flowrl.config_nodes import class_at, declared_options

#: keys of a class node that are not options of the class
_NODE_KEYS = {"class_path", "init_args", "dict_kwargs", "help"}
#: the keys LightningCLI gives every subcommand besides the Trainer method's own arguments
_CLI_KEYS = ("config", "print_config", "seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler",
             "help")


def subcommand_keys(subcommand: str) -> Optional[list[str]]:
    """The top-level keys of a LightningCLI subcommand (None: not one of its subcommands): LightningCLI's own and
    the arguments of the Trainer method it runs, less those it fills itself (the model, the data).

    >>> subcommand_keys("fit")[-2:], subcommand_keys("export")
    (['ckpt_path', 'weights_only'], None)
    """
    from lightning.pytorch import Trainer
    from lightning.pytorch.cli import LightningCLI

    skipped = LightningCLI.subcommands().get(subcommand)
    if skipped is None:
        return None
    own = [k for k in inspect.signature(getattr(Trainer, subcommand)).parameters if k != "self" and k not in skipped]
    return [*_CLI_KEYS, *own]


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
    top = subcommand_keys(args[0]) if args else None
    if any(a.startswith(("--model.init_args.policy=", "--model.init_args.policy.class_path")) for a in args):
        model = {**model, "init_args": {k: v for k, v in (model.get("init_args") or {}).items() if k != "policy"}}
    while i < len(args):  # (a policy named on the command line: its options are left to the parser)
        arg = args[i]
        key, eq, _ = arg.partition("=")
        used = 1 if eq or not key.startswith("--") or i + 1 >= len(args) or args[i + 1].startswith("--") else 2
        given = arg if eq else " ".join(args[i:i + used])
        problem = (_top_problem(key, given, args[0], top) if top and key.startswith("--") and "." not in key
                   else _problem(key, given, model) if key.startswith("--") else None)
        if problem is None:
            out += args[i:i + used]
        else:
            problems.append(problem)
        i += used
    return out, problems


def _top_problem(key: str, given: str, subcommand: str, keys: list[str]) -> Optional[str]:
    """A subcommand-level key no one declares (``--ckpt_pth``), with the nearest declared key."""
    name = key[2:].rstrip("+")
    if name in keys:
        return None
    near = difflib.get_close_matches(name, keys, n=1, cutoff=0.6)
    fix = f"did you mean --{near[0]}?" if near else f"`python -m flowrl {subcommand} --help` lists every option"
    return f"{given}: `{subcommand}` has no option {name}; {fix}"


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
