"""``python -m flowrl {fit,validate,test,predict}``: LightningCLI with omegaconf interpolation; ``python -m flowrl
export --ckpt CKPT --out DIR [--merged]`` writes a trained policy for diffusers (:mod:`flowrl.cli.export`) and
``python -m flowrl evaluate`` compares models on a prompt suite (:mod:`flowrl.cli.evaluate`); the top-level
``--help`` lists all six.

``parser_mode="omegaconf+"`` resolves interpolations after command-line overrides are applied (plain
``omegaconf`` resolves them per file and then ignores an override of a referenced key); absolute interpolation
paths are made relative so ``${data.group_size}`` works from inside a nested class's ``init_args``.
Every problem of the run is collected and raised together before any weight loads: those of the parsed config, then
those of the built objects (building a policy reads only its configs; weights load in ``configure_model``).
A ``null`` override of a key inside a nested class (``--model.init_args.policy.init_args.lora=null``) is passed on
as a one-key config layer, in place: jsonargparse turns such a command-line ``null`` into the string ``'None'``.
``predict`` takes short options (``--prompts``, ``--seeds``, ...; :mod:`flowrl.cli.predict`) and writes images
with :class:`flowrl.callbacks.ImageWriter`. The console shows the run: :class:`flowrl.callbacks.RunHeader` at the
start, :class:`flowrl.callbacks.RunProgressBar`, and :mod:`flowrl.cli.warning_filters` filters what is not the run's.
A SIGTERM stops ``fit`` after the current batch with a checkpoint and the summary
(:class:`flowrl.callbacks.SigtermStop`), and the process exits 143.
"""

from __future__ import annotations

import importlib
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

from jsonargparse import set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import BasePredictionWriter, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.cli import _get_short_description as short_description
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
import torch

import flowrl.cli.warning_filters  # noqa: F401  first: its filters must be in place before diffusers is imported
from flowrl.callbacks.image_writer import ImageWriter
from flowrl.callbacks.progress import RunProgressBar
from flowrl.callbacks.run_header import RunHeader
from flowrl.callbacks.sigterm_stop import SigtermStop
from flowrl.checkpoints.paths import (EXAMPLE, checkpoint_problems, newest_run_checkpoint, resolve_checkpoint,
                                      run_checkpoint)
from flowrl.cli.arguments import null_overrides_as_configs
from flowrl.cli.config_checks import built_problems, config_problems, policy_stand_in, predict_problems
from flowrl.cli.log_versions import launched_as_rank_zero, link_latest, log_roots, release_unused, share_log_versions
from flowrl.cli.machine_checks import free_memory, rollout_memory_problems
from flowrl.cli.method_switch import method_switch
from flowrl.cli.option_names import unknown_options
from flowrl.cli.parsed_config import ParsedConfigParser
from flowrl.cli.predict import DESCRIPTION as PREDICT_DESCRIPTION
from flowrl.cli.process_group import end_process_group_at_exit
from flowrl.cli.rendezvous import rendezvous_notice
from flowrl.cli.run_checks import parts_without_model, run_problems, unbuilt_method
from flowrl.config_nodes import as_dict
from flowrl.data import PromptDataModule
from flowrl.methods.base import BaseModule
from flowrl.methods.option_surface import MethodOptionsError
from flowrl.model_paths import MODEL_KEY, cache_only
from flowrl.policies.pipeline_policy import PolicyOptionsError
from flowrl.prompt_records import data_record_problems
from flowrl.strategies.context_parallel import data_parallel_size

DESCRIPTION = "flowrl: RL post-training of diffusion and flow-matching generators, a PyTorch Lightning plug-in."
#: the subcommands that are not LightningCLI's: {name: (the top-level help's line, the module whose main runs it)}
OWN_SUBCOMMANDS = {
    "evaluate": ("The base model against tuned checkpoints on a prompt suite, with a report folder.",
                 "flowrl.cli.evaluate"),
    "export": ("A trained policy as diffusers files (LoRA weights, or a merged pipeline).", "flowrl.cli.export"),
}

#: LightningCLI's subcommands and the Trainer method arguments each leaves out
LIGHTNING = LightningCLI.subcommands()
TRAINER_DEFAULTS: dict[str, Any] = {
    "use_distributed_sampler": False,  # the group sampler already splits batches over ranks
    "log_every_n_steps": 1,
    "enable_model_summary": False,  # flowrl.callbacks.RunHeader prints the parameters trained, with the run's setup
}


class FlowRLCLI(LightningCLI):
    """The flowrl command line; see ``python -m flowrl fit --help``.

    Args:
        command_line_problems: problems :func:`main` found in the command line itself (option names no class
            declares, taken out before the parse), raised with those of the parsed config.
    """

    def __init__(self, *args: Any, command_line_problems: tuple[str, ...] = (), **kwargs: Any) -> None:
        self.command_line_problems = list(command_line_problems)
        given = sys.argv[1:] if kwargs.get("args") is None else kwargs["args"]
        #: the LightningCLI subcommand the command line names first (None: none, as for the top-level --help)
        self.chosen = given[0] if isinstance(given, (list, tuple)) and given[:1] and given[0] in LIGHTNING else None
        super().__init__(*args, parser_class=ParsedConfigParser, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """LightningCLI's subcommands whose parsers are built: only the one this command runs, when it names one
        (building each reads the Trainer's, the method's and the data's signatures, a sixth of a tiny fit's cost)."""
        return {self.chosen: LIGHTNING[self.chosen]} if self.chosen else dict(LIGHTNING)

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        # parsed and validated: their dumps (the hyperparameters, config.yaml) need not validate them again
        self.parser.validated, self._parser(self.subcommand).validated = self.config, config
        self.config_problems = list(self.command_line_problems)
        if self.subcommand == "predict":
            self.config_problems += predict_problems(config)
        elif self.subcommand == "fit":
            self.config_problems += config_problems(config)
        if self.subcommand != "fit":
            if self.config_problems:
                raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(self.config_problems))
            return
        share_log_versions(config.get("trainer", {}).get("logger"), rank_zero=launched_as_rank_zero())

    def instantiate_classes(self) -> None:
        """Build the run (cheap: no weight loads before ``fit``), then raise every problem together: the parsed
        config's (:meth:`before_instantiate_classes`), a policy's or method's options refused while building, and
        those of the built objects (:func:`~flowrl.cli.config_checks.built_problems`,
        :func:`~flowrl.cli.run_checks.run_problems`). A run that cannot be built is checked on the parts that can
        (:func:`~flowrl.cli.run_checks.parts_without_model`), with the method built without its policy."""
        if self.subcommand == "predict":
            super().instantiate_classes()  # the records against the policy's conditioning images, on both built
            if problems := data_record_problems(self.datamodule, self.model.policy):
                raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
            return None
        if self.subcommand != "fit":
            return super().instantiate_classes()
        problems, config = self.config_problems, self.config[self.subcommand]
        ckpt, given = config.get("ckpt_path"), config.get("trainer", {}).get("strategy")
        try:
            with cache_only(any(problem.startswith(f"{MODEL_KEY}=") for problem in problems)):
                super().instantiate_classes()
        except Exception as err:  # noqa: BLE001  a config the checks refuse may not build at all: they say why
            refused = refusal(err)  # jsonargparse may wrap the error a class raised while it built it
            data, trainer = parts_without_model(self.parser, self.config, self.subcommand)
            if isinstance(refused, MethodOptionsError):  # the policy built: every problem of the method's options
                module, unbuilt = unbuilt_method(config, data, refused.problems)
            else:  # a policy's options refused (the method is checked without it), a model folder missing...
                module, unbuilt = unbuilt_method(config, data)
                unbuilt = [*map(policy_key, getattr(refused, "problems", [])), *unbuilt]
            node = config.get("model", {}).get("init_args", {}).get("policy")
            unbuilt += run_problems(module, policy_stand_in(node), data, trainer, ckpt, policy_config=node)
            if not problems and not unbuilt:
                raise
            problems += unbuilt
        else:
            trainer = self.trainer
            problems += built_problems(self.model, self.datamodule, data_parallel_size(
                trainer.strategy, trainer.num_devices * trainer.num_nodes), trainer.max_steps)
            problems += run_problems(self.model, self.model.policy, self.datamodule, trainer, ckpt, given)
        if problems:
            raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))

    def _add_subcommands(self, parser, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        subcommands = parser._subcommands_action
        for choice in subcommands._choices_actions:  # Lightning's line is the Trainer's ("Run inference on your data")
            if choice.dest == "predict":
                choice.help = PREDICT_DESCRIPTION
        # LightningCLI's that this command does not run (not built: see subcommands) and those main() runs before
        # LightningCLI parses anything: named with their line, as the top-level help lists them
        unbuilt = {name: (short_description(getattr(Trainer, name)), None) for name in LIGHTNING
                   if name not in self.subcommands()}
        for name, (description, _) in {**unbuilt, **OWN_SUBCOMMANDS}.items():
            subcommands.add_subcommand(name, LightningArgumentParser(description=description), help=description)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters right after parsing, before any hook of ours: a 0-byte
        # or cut-off file would surface as torch's bare EOFError or zip error
        config = self.config.get(self.config.get("subcommand") or "", self.config)
        if config.get("ckpt_path") == "last" and self.config.get("subcommand") == "fit":
            config["ckpt_path"] = str(last_checkpoint(as_dict(config.get("trainer"))))
        if ckpt := config.get("ckpt_path"):
            if problems := checkpoint_problems(str(ckpt)):
                raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
            if (found := resolve_checkpoint(str(ckpt))) != Path(str(ckpt)).expanduser():
                print(f"flowrl: ckpt_path={ckpt} is a run folder; loading its {found}", flush=True)
                config["ckpt_path"] = str(found)
        super()._parse_ckpt_path()

    def parse_arguments(self, parser, args) -> None:
        # main(args) hands LightningCLI its own arguments; the caller's sys.argv (a test runner's, a script's) is not
        # a second command line, which is all Lightning's warning about seeing both is for
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, args)

    def instantiate_trainer(self, **kwargs: Any):
        trainer = self.config_init.get(self.subcommand, self.config_init).get("trainer")
        callbacks = list(trainer.get("callbacks") or [])
        if trainer.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(RunProgressBar())
        if self.subcommand == "fit" and not any(isinstance(c, RunHeader) for c in callbacks):
            callbacks.append(RunHeader())
        if self.subcommand == "fit" and not any(isinstance(c, SigtermStop) for c in callbacks):
            callbacks.append(SigtermStop())  # says it stops, saves a checkpoint and the summary on SIGTERM
        if self.subcommand == "predict":
            if not any(isinstance(c, BasePredictionWriter) for c in callbacks):
                callbacks.append(ImageWriter())
            # predict logs no metric, and Lightning's loggers would still write hyperparameters into the run's
            # version folder (a fit config pins it) and clear its metrics.csv: the images' folder is the output
            self.save_config_callback, trainer["logger"] = None, False
        trainer["callbacks"] = callbacks
        return super().instantiate_trainer(**kwargs)

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        finally:  # a long-lived process (a test, a notebook) gets its own SIGTERM handler back whatever ended the fit
            for callback in self.trainer.callbacks if self.trainer is not None else []:
                if isinstance(callback, SigtermStop):
                    callback.restore()

    def before_fit(self) -> None:
        if problems := self.rollout_memory_problems():  # before the first batch, whose rollout would fill the memory
            raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(problems))
        # the CSV writer of a fresh version starts while the folder is still empty: Lightning warns about (and would
        # delete) an older metrics.csv when it finds the folder non-empty, which here only means TensorBoard's events
        if launched_as_rank_zero() and (notice := rendezvous_notice(self.trainer)):
            print(notice, flush=True)  # once, before the rendezvous, which waits in silence until its timeout
        if launched_as_rank_zero():
            for logger in self.trainer.loggers:
                if isinstance(logger, CSVLogger):
                    logger.experiment  # noqa: B018
            folders = {Path(logger.log_dir) for logger in self.trainer.loggers if getattr(logger, "log_dir", None)}
            for folder in folders:  # runs/<name>/latest: the newest run, whatever its version number
                link_latest(folder)

    def rollout_memory_problems(self) -> list[str]:
        """A batch too large for the memory of the device its rollout runs on (:mod:`flowrl.cli.machine_checks`)."""
        policy, data = getattr(self.model, "policy", None), self.datamodule
        if not hasattr(policy, "latent_shape") or not hasattr(data, "group_size"):
            return []
        samples = data.num_groups * data.group_size // data_parallel_size(self.trainer.strategy,
                                                                          max(self.trainer.world_size, 1))
        device = self.trainer.strategy.root_device
        return rollout_memory_problems(samples, self.model.num_steps, policy.latent_shape(), free_memory(device),
                                       f"the {device.type} device" if device.type != "cpu" else "this machine")


def policy_key(problem: str) -> str:
    """A policy's problem (``policy.height=40 ...``) under the key a config writes it with.

    >>> policy_key("policy.height=40 must be a positive multiple of 16")
    'model.init_args.policy.init_args.height=40 must be a positive multiple of 16'
    """
    return "model.init_args.policy.init_args." + problem[len("policy."):] if problem.startswith("policy.") else problem


def refusal(err: BaseException) -> BaseException:
    """The options error (a policy's or a method's) behind ``err``, following its causes; else ``err``."""
    seen = err
    while seen is not None:
        if isinstance(seen, (PolicyOptionsError, MethodOptionsError)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return err


def last_checkpoint(trainer: dict) -> Path:
    """What ``fit --ckpt_path last`` resumes: the newest checkpoint in the run's earlier version folders (Lightning
    would look only in this run's new, empty one, and train from step 0). Read before this run reserves its version.

    Raises:
        SystemExit: no version folder holds a checkpoint; names the folders looked in.
    """
    roots = log_roots(trainer)
    # a ModelCheckpoint's own dirpath (outside the version folders) holds the run's checkpoints too
    folders = [Path(str(d)).expanduser() for c in trainer.get("callbacks") or []
               if (d := as_dict(as_dict(c).get("init_args")).get("dirpath"))]
    found = [c for c in (newest_run_checkpoint(roots), *map(run_checkpoint, folders)) if c is not None]
    found = max(found, key=lambda p: p.stat().st_mtime) if found else None
    if found is None:
        raise SystemExit("flowrl: invalid configuration:\n  ckpt_path=last: no checkpoint in any version folder of "
                         f"{', '.join(map(str, [*roots, *folders])) or 'the loggers (none configured)'}; pass the "
                         f"checkpoint's path (e.g. {EXAMPLE}) or run folder, or leave ckpt_path out to start a new run")
    if launched_as_rank_zero():
        print(f"flowrl: ckpt_path=last: loading {found}", flush=True)
    return found


def main(args: Optional[list[str]] = None) -> None:
    try:
        return _main(args)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            end_process_group_at_exit()


def _main(args: Optional[list[str]]) -> None:
    from_argv = args is None
    args = sys.argv[1:] if from_argv else args
    if args[:1] and args[0] in OWN_SUBCOMMANDS:  # not LightningCLI's: each parses its own options
        return importlib.import_module(OWN_SUBCOMMANDS[args[0]][1]).main(args[1:])
    predicting = args[:1] == ["predict"]
    if predicting:  # LightningCLI's predict, reached through short options
        from flowrl.cli.predict import predict_arguments

        args = predict_arguments(args[1:])
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    switch = method_switch(args)
    if switch.notice and launched_as_rank_zero():
        print(switch.notice, flush=True)
    args, command_line_problems = unknown_options(switch.args, switch.model)
    if command_line_problems and any(arg.startswith("--print_config") for arg in args):  # it prints, then exits
        raise SystemExit("flowrl: invalid configuration:\n  " + "\n  ".join(command_line_problems))
    args = null_overrides_as_configs(args)
    if from_argv:  # LightningCLI reads sys.argv itself, and warns when given args beside a command line
        sys.argv[1:], args = args, None
    try:
        with warnings.catch_warnings():
            if predicting:  # ModelCheckpoint saves nothing in predict: the state it restores (kept only when its
                # folder's name is the same: not for runs/<name>/latest, a relative path or a moved run) is never read
                warnings.filterwarnings("ignore", message="The dirpath has changed from")
            FlowRLCLI(BaseModule, PromptDataModule, subclass_mode_model=True, trainer_defaults=TRAINER_DEFAULTS,
                      parser_kwargs={"parser_mode": "omegaconf+", "prog": "python -m flowrl",
                                     "description": DESCRIPTION},
                      save_config_kwargs={"overwrite": True}, args=args,
                      command_line_problems=command_line_problems)
    except SIGTERMException as stop:  # Lightning stops (and checkpoints, if configured) and exits 0: a scheduler
        raise SystemExit(128 + signal.SIGTERM) from stop  # would read success; the shell's code for SIGTERM instead
    finally:
        release_unused()  # a run stopped before it wrote anything leaves no empty version_N behind
