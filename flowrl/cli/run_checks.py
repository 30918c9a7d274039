"""Checks between the built parts of a ``fit`` run, before any weight loads (:func:`run_problems`): the checkpoint
against the module, the prompt records against the policy's conditioning images, the rewards against the policy,
and the trainer's strategy against the method, the data and the processes.

They read built objects: the run's own, or, where the run could not be built (a policy's options refused, its model
folder missing, a method's options refused), those of its other parts (the data module and the trainer's options,
built by the parser without the model: :func:`parts_without_model`), the method built without its policy and a
stand-in for the policy (:func:`unbuilt_method`, :func:`~flowrl.cli.config_checks.policy_stand_in`), so that every
problem of the run is still reported at once.
"""

from __future__ import annotations

import warnings
from argparse import ArgumentError
from types import SimpleNamespace
from typing import Any, Optional

from flowrl.checkpoints.fit import checkpoint_fit_problems
from flowrl.checkpoints.paths import checkpoint_problems
from flowrl.cli.config_checks import built_problems, layout_problems, method_without_policy, world_size
from flowrl.cli.reward_checks import reward_policy_problems
from flowrl.methods.option_surface import MethodOptionsError
from flowrl.prompt_records import data_record_problems
from flowrl.strategies.checks import strategy_problems
from flowrl.strategies.context_parallel import data_parallel_size


def run_problems(module: Any, policy: Any, data: Any, trainer: Any, ckpt: Optional[str] = None,
                 given: Any = None, policy_config: Any = None) -> list[str]:
    """Problems between the built ``module`` (or the method's class, where it could not be built), ``policy`` (or
    its stand-in), the data module ``data`` and ``trainer`` (the built ``Trainer`` or :func:`parsed_trainer`; None
    with ``data`` where those could not be built either), and the checkpoint ``ckpt`` to resume. ``given``: the
    strategy as the config writes it (shown in its messages); ``policy_config``: the parsed policy config the
    checkpoint is compared with where ``policy`` is a stand-in."""
    problems = []
    if ckpt and not checkpoint_problems(str(ckpt)):  # an unreadable one is reported with the config's problems
        problems += checkpoint_fit_problems(str(ckpt), module, policy if policy_config is None else policy_config,
                                            "resume")
    if data is not None:
        problems += data_record_problems(data, policy)  # images the policy takes (an edit's sources) or does not
    if data is not None and trainer is not None:
        problems += reward_policy_problems(trainer.callbacks, policy, data)  # rewards that cannot score its output
        problems += strategy_problems(trainer, module, data, ckpt, given)
    return problems


def parsed_trainer(options: Any) -> SimpleNamespace:
    """The trainer's parsed options (its callbacks and a ``class_path`` strategy built by the parser) in the
    attributes the checks read of a built ``Trainer``: ``strategy`` (a registered name or a built one),
    ``num_devices`` (None: known only once Lightning picks the devices), ``num_nodes``, ``callbacks``,
    ``accelerator``. For a run whose trainer was not built: the model failed first, or Lightning refuses the options
    (DeepSpeed not installed, a GPU config on a machine without one).

    >>> trainer = parsed_trainer({"strategy": "fsdp2", "devices": [0, 1], "num_nodes": 2})
    >>> trainer.num_devices * trainer.num_nodes, trainer.accelerator
    (4, 'auto')
    """
    options = dict(options if isinstance(options, dict) else vars(options))
    return SimpleNamespace(strategy=options.get("strategy") or "auto",
                           num_devices=world_size({"devices": options.get("devices", "auto")}),
                           num_nodes=options.get("num_nodes") or 1, callbacks=list(options.get("callbacks") or []),
                           accelerator=options.get("accelerator") or "auto")


def parts_without_model(parser: Any, config: Any, subcommand: str) -> tuple[Any, Any]:
    """The data module and the trainer's options (:func:`parsed_trainer`) of the parsed ``config`` built by the
    CLI's ``parser`` as the run builds them, without the model, which could not be built; a callback that cannot be
    built either (a reward that refuses its options or misses its model folder, reported with the config's
    problems) is left out, the others kept. ``(None, None)`` where the data module or the trainer's options cannot be
    built."""
    config, key = config.clone(), f"{subcommand}.trainer.callbacks"
    del config[f"{subcommand}.model"]
    nodes = config.get(key) or []
    callbacks = []
    for node in nodes if isinstance(nodes, list) else [nodes]:  # each alone: one refused leaves the others
        config[key] = [node]
        callbacks += (_built(parser, config, subcommand) or {"trainer": {"callbacks": []}})["trainer"]["callbacks"]
    config[key] = []
    if (built := _built(parser, config, subcommand)) is None:
        return None, None
    return built["data"], parsed_trainer({**vars(built["trainer"]), "callbacks": callbacks})


def _built(parser: Any, config: Any, subcommand: str) -> Any:
    """``config`` built by ``parser`` (its ``subcommand`` part), or None where it cannot be."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # jsonargparse deprecates instantiate_classes (LightningCLI's call too)
            return parser.instantiate_classes(config)[subcommand]
    except Exception:  # noqa: BLE001  reported with the config's problems, or once the model builds
        return None


def unbuilt_method(config: Any, data: Any, method_problems: Optional[list[str]] = None) -> tuple[Any, list[str]]:
    """The method of a ``fit`` config whose run could not be built, and :func:`built_problems` of it: with
    ``method_problems`` (the method refused its options) its class and those; else (a policy refused, a model folder
    missing) the method built without its policy (:func:`method_without_policy`) and its problems. ``data``: the
    data module built without the model, or None (then the config's data options)."""
    from flowrl.config_nodes import as_dict, class_at, with_defaults
    from flowrl.data import PromptDataModule
    from flowrl.methods.base import BaseModule

    model, trainer = as_dict(config.get("model")), as_dict(config.get("trainer"))
    cls = class_at(model.get("class_path")) or BaseModule
    data = with_defaults(PromptDataModule, config.get("data")) if data is None else data
    world = data_parallel_size(trainer.get("strategy"), world_size(trainer) or 1)  # replicas
    if method_problems is None:
        try:
            method = method_without_policy(cls, model.get("init_args"))
            return method, built_problems(method, data, world, trainer.get("max_steps", -1))
        except MethodOptionsError as err:
            method_problems = err.problems
        except (TypeError, ValueError, ArgumentError):  # options only the run's own parse resolves: not checked here
            method_problems = []
    return cls, method_problems + layout_problems(data, cls, world)
