"""The one way a trained policy is loaded outside ``fit``: by ``python -m flowrl export`` and ``evaluate`` (and by
tests that sample from a run). ``predict`` loads the whole module through LightningCLI instead, from the same paths
(:mod:`flowrl.checkpoints.paths`).

The policy is rebuilt from the run's ``config.yaml`` (LightningCLI saves it in the log directory, the parent of
``checkpoints/``) or a config given, the checkpoint supplies the trained weights, and a checkpoint that does not fit
the config is named before the policy's weights load (:mod:`flowrl.checkpoints.fit`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import yaml

from flowrl.checkpoints.fit import checkpoint_fit_problems, load_mismatch
from flowrl.checkpoints.paths import checkpoint_problems, resolve_checkpoint, run_config
from flowrl.checkpoints.sharded import is_sharded_checkpoint, load_consolidated
from flowrl.policies.base import FlowPolicy, adapter_of

#: the frozen reference copy a method may keep beside its policy (full fine-tuning with a KL): not the trained weights
REFERENCE_PREFIX = "reference_denoiser."


def read_checkpoint(path: str | Path) -> dict:
    """The whole checkpoint dict of a fit run: a ``torch.save`` file, or a sharded (FSDP2) checkpoint's folder with
    every rank's shards gathered whole in this process."""
    if is_sharded_checkpoint(path):
        return load_consolidated(Path(path))
    return torch.load(path, map_location="cpu", weights_only=False)


def find_run_config(ckpt: Path) -> Path:
    """The ``config.yaml`` LightningCLI saved for the run of ``ckpt`` (its folder or the one above).

    Raises:
        FileNotFoundError: there is none; the message says to pass the run's config.
    """
    if (found := run_config(ckpt)) is not None:
        return found
    raise FileNotFoundError(f"no config.yaml beside {ckpt} or in {ckpt.parent.parent}; pass the run's config with "
                            "--config (the file given to `fit --config`, with the same policy settings)")


def policy_from_spec(spec: dict, load: bool = True) -> FlowPolicy:
    """Instantiates a policy spec ``{class_path, init_args}`` as the CLI parses it and loads its weights (from its
    model path; ``load`` False: built from its configs only, for checks before loading): the one loading function of
    export and evaluate."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(FlowPolicy, "policy")
    policy = parser.instantiate_classes(parser.parse_object({"policy": spec})).policy
    return policy.load() if load else policy


def policy_from_config(config: Path) -> FlowPolicy:
    """Instantiates ``model.init_args.policy`` of a fit config (the frozen weights load from its model path)."""
    spec = (yaml.safe_load(config.read_text()) or {}).get("model", {}).get("init_args", {}).get("policy")
    if spec is None:
        raise ValueError(f"{config} has no model.init_args.policy; pass the config of the run that wrote the "
                         "checkpoint")
    return policy_from_spec(spec)


def ema_weights(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The averaged weights a ``flowrl.callbacks.EMA`` callback stored in a checkpoint, named as in the module's
    ``state_dict``."""
    found = {key: state["shadow"] for key, state in checkpoint.get("callbacks", {}).items()
             if key.startswith("EMA") and isinstance(state, dict) and "shadow" in state}
    if len(found) != 1:
        raise ValueError(f"--ema needs the state of exactly one flowrl.callbacks.EMA in the checkpoint, found "
                         f"{list(found) or 'none'}; train with `- class_path: flowrl.callbacks.EMA` or leave --ema "
                         "out")
    return next(iter(found.values()))


def checkpoint_average(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """:func:`ema_weights` of the fit checkpoint ``ckpt``: a file read memory-mapped (only the average's bytes are
    read, not the trained weights beside it), a sharded checkpoint's folder gathered whole."""
    if is_sharded_checkpoint(ckpt):
        return ema_weights(load_consolidated(Path(ckpt)))
    return ema_weights(torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True))


def ema_problem(ckpt: str | Path) -> Optional[str]:
    """Why ``ckpt`` holds no average for ``--ema`` (not exactly one ``flowrl.callbacks.EMA`` state), or None; a
    sharded checkpoint's folder is checked when it loads (gathering it here would read every shard)."""
    if is_sharded_checkpoint(ckpt):
        return None
    try:
        checkpoint_average(ckpt)
    except ValueError as err:
        return str(err)
    return None


def load_policy(ckpt: str | Path, config: Optional[str | Path] = None, ema: bool = False) -> FlowPolicy:
    """The policy of a fit run with the checkpoint's trained weights (``ema``: their EMA average instead).

    Raises:
        ValueError: the checkpoint is missing, empty, cut off or does not fit the config's policy (one line each).
    """
    if problems := checkpoint_problems(str(ckpt)):
        raise ValueError(problems[0].replace("ckpt_path=", "--ckpt ", 1).replace("leave ckpt_path out", "retrain")
                         .replace(", or leave it out", ""))  # export needs one
    ckpt = resolve_checkpoint(ckpt)  # a run's folder: its last.ckpt
    checkpoint = read_checkpoint(ckpt)
    average = ema_weights(checkpoint) if ema else {}  # before the (slow) policy load: a missing EMA fails first
    config = Path(config) if config else find_run_config(ckpt)
    model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
    # the method by its class path: only the trained ``default`` adapter must fit, so its class need not be imported
    method = model.get("class_path")
    if method and (wrong := checkpoint_fit_problems(str(ckpt), method, (model.get("init_args") or {}).get("policy"),
                                                    "export")):
        raise ValueError(wrong[0].replace("ckpt_path=", "--ckpt ", 1))
    policy = policy_from_config(config)
    state = {**checkpoint["state_dict"], **average}
    weights = {k[len("policy."):]: v.to(checkpoint["state_dict"][k].dtype) for k, v in state.items()
               if k.startswith("policy.") and not k.startswith("policy." + REFERENCE_PREFIX)}
    # a method's own adapters (TDM-R1's fake score and surrogate, DiffusionNFT's old policy), frozen: the policy's
    # adapter stays the one trained adapter that export picks by default
    for name in dict.fromkeys(adapter_of(k) for k in weights):
        if name is not None and name not in policy.adapter_names:
            policy.add_adapter(name, policy.lora, trainable=False)
    theirs = {k: tuple(v.shape) for k, v in weights.items()}
    if why := load_mismatch(theirs, {k: tuple(v.shape) for k, v in policy.state_dict().items()},
                            checkpoint.get("flowrl_method"), f"the policy of {config}"):
        raise ValueError(f"{why}; pass the config of the run that wrote it with --config (or leave --config out: the "
                         "config.yaml beside the checkpoint)")
    policy.load_state_dict(weights)
    return policy
