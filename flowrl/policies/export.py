"""Export a trained policy for the plain diffusers pipeline: ``python -m flowrl export --ckpt CKPT --out DIR``.

LoRA runs write ``DIR/pytorch_lora_weights.safetensors`` with the pipeline's own ``save_lora_weights`` (rank and
alpha in its metadata), loadable with ``pipe.load_lora_weights(DIR)``; Wan 2.2's low-noise expert goes to
``DIR/pytorch_lora_weights_transformer_2.safetensors``, loaded with ``pipe.load_lora_weights(DIR, weight_name=...,
load_into_transformer_2=True)``. ``--merged`` also writes the whole pipeline with the adapters fused into the
transformer to ``DIR/merged``. Full fine-tuning runs write the whole pipeline to ``DIR``. The policy is rebuilt from
the run's ``config.yaml`` (LightningCLI saves it in the log directory, the parent of ``checkpoints/``) or
``--config``; the checkpoint supplies the trained weights. An export into a folder holding an earlier one leaves
exactly its own files there (:mod:`flowrl.policies.export_folder`); ``--out`` an existing file is refused before
anything loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch
import yaml

from flowrl.checkpoint_fit import checkpoint_fit_problems, load_mismatch
from flowrl.checkpoint_paths import checkpoint_problems, resolve_checkpoint, run_config
from flowrl.config_nodes import class_at
from flowrl.policies.base import FlowPolicy, adapter_of
from flowrl.policies.export_folder import out_problem, staged
from flowrl.strategies.sharded_checkpoint import is_sharded_checkpoint, load_consolidated

REFERENCE_PREFIX = "reference_denoiser."
WEIGHTS_NAME = "pytorch_lora_weights.safetensors"


def exported_adapter(policy: FlowPolicy, adapter: Optional[str] = None) -> str:
    """The adapter to export: ``adapter``, or the policy's one trained adapter.

    Raises:
        ValueError: no adapter of that name, or several trained adapters and none named.
    """
    if adapter is not None:
        if adapter not in policy.adapter_names:
            raise ValueError(f"the policy has no adapter {adapter!r}; its adapters: {policy.adapter_names}")
        return adapter
    trained = [name for name in policy.adapter_names if policy.trainable_parameters(name)]
    if len(trained) != 1:
        raise ValueError(f"the policy trains the adapters {trained}: name the one to export (--adapter NAME)")
    return trained[0]


def export_lora(policy: FlowPolicy, out: str | Path, adapter: Optional[str] = None,
                keep: tuple[str, ...] = ()) -> Path:
    """Writes the LoRA weights of ``adapter`` (default: the one trained adapter) in the diffusers layout of the
    policy's pipeline, replacing what an earlier export left in ``out`` (:func:`~flowrl.policies.export_folder.staged`;
    ``keep``: entries a later step writes); returns ``out``.

    Raises:
        ValueError: the policy was fully fine-tuned (no adapters), it is not pipeline-backed, or ``out`` is a file.
    """
    from peft.utils import get_peft_model_state_dict

    _check_exportable(policy)
    if not policy.adapter_names:
        raise ValueError("this policy was fully fine-tuned: it has no LoRA weights; use export_pipeline")
    adapter = exported_adapter(policy, adapter)
    name = getattr(policy, "denoiser_name", "transformer")
    with staged(out, keep) as stage:
        for weight_name, module in lora_modules(policy).items():
            policy.pipeline_class.save_lora_weights(
                stage, weight_name=weight_name,
                **{f"{name}_lora_layers": get_peft_model_state_dict(module, adapter_name=adapter),
                   f"{name}_lora_adapter_metadata": module.peft_config[adapter].to_dict()})
    return Path(out)


def lora_modules(policy: FlowPolicy) -> dict[str, torch.nn.Module]:
    """The file each module with LoRA adapters is written to: the denoiser's ``pytorch_lora_weights.safetensors``,
    or a policy's own ``lora_modules()`` (Wan 2.2 writes each trained expert to a file of its own)."""
    own = getattr(policy, "lora_modules", None)
    return own() if own is not None else {WEIGHTS_NAME: policy.denoiser}


def export_pipeline(policy: FlowPolicy, out: str | Path, adapter: Optional[str] = None) -> Path:
    """Writes the whole pipeline with the trained denoiser; the LoRA adapter ``adapter`` (default: the one trained
    adapter) is fused into it first, **in place**, and every adapter is then removed (export from a policy you no
    longer train). What an earlier export left in ``out`` is replaced as by :func:`export_lora`."""
    _check_exportable(policy)
    if problem := out_problem(out):  # before the fusing, which changes the policy
        raise ValueError(problem)
    if policy.adapter_names:
        policy.denoiser.fuse_lora(adapter_names=[exported_adapter(policy, adapter)])
        policy.denoiser.unload_lora()
    with staged(out, pipeline=True) as stage:
        policy.pipeline().save_pretrained(stage)
    return Path(out)


def _check_exportable(policy: FlowPolicy) -> None:
    if not hasattr(policy, "pipeline"):
        raise ValueError(f"{type(policy).__name__} is not backed by a diffusers pipeline and cannot be exported; "
                         "export works for SD3Policy, FluxPolicy and the other pipeline adapters")


def find_run_config(ckpt: Path) -> Path:
    """The ``config.yaml`` LightningCLI saved for the run of ``ckpt`` (its folder or the one above)."""
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
                         f"{list(found) or 'none'}; train with `- class_path: flowrl.callbacks.EMA` or export without "
                         "--ema")
    return next(iter(found.values()))


def load_policy(ckpt: str | Path, config: Optional[str | Path] = None, ema: bool = False) -> FlowPolicy:
    """The policy of a fit run with the checkpoint's trained weights (``ema``: their EMA average instead).

    Raises:
        ValueError: the checkpoint is missing, empty, cut off or does not fit the config's policy (one line each).
    """
    if problems := checkpoint_problems(str(ckpt)):
        raise ValueError(problems[0].replace("ckpt_path=", "--ckpt ", 1).replace("leave ckpt_path out", "retrain")
                         .replace(", or leave it out", ""))  # export needs one
    ckpt = resolve_checkpoint(ckpt)  # a run's folder: its last.ckpt
    if is_sharded_checkpoint(ckpt):  # an FSDP2 run's folder: every rank's shards, gathered whole in this process
        checkpoint = load_consolidated(ckpt)
    else:
        checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    average = ema_weights(checkpoint) if ema else {}  # before the (slow) policy load: a missing EMA fails first
    config = Path(config) if config else find_run_config(ckpt)
    model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
    method = class_at(model.get("class_path"))
    if method is not None and (wrong := checkpoint_fit_problems(str(ckpt), method, (model.get("init_args") or {})
                                                                .get("policy"), "export")):
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


def main(args: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowrl export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a checkpoint of a fit run (a file, a sharded checkpoint's "
                        "folder from --trainer.strategy=fsdp2, or the run's folder: its last.ckpt)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--config", help="the run's config (default: config.yaml saved beside the checkpoints)")
    parser.add_argument("--merged", action="store_true", help="also write the pipeline with LoRA fused, to OUT/merged")
    parser.add_argument("--ema", action="store_true", help="export the flowrl.callbacks.EMA average of the weights")
    parser.add_argument("--adapter", help="the LoRA adapter to export (default: the policy's one trained adapter)")
    opts = parser.parse_args(args)
    try:
        if problem := out_problem(opts.out):  # before the weights load; never a "-> FILE" that wrote nothing
            raise ValueError(problem)
        policy = load_policy(opts.ckpt, opts.config, opts.ema)
        out = Path(opts.out)
        if not policy.adapter_names:
            print(f"flowrl export: full pipeline -> {export_pipeline(policy, out)}")
            return
        keep = ("merged",) if opts.merged else ()  # written next, whole
        print(f"flowrl export: LoRA weights -> {export_lora(policy, out, opts.adapter, keep)}")
        if opts.merged:
            print(f"flowrl export: merged pipeline -> {export_pipeline(policy, out / 'merged', opts.adapter)}")
    except (ValueError, FileNotFoundError) as err:  # one line naming the option and the fix, not a traceback
        raise SystemExit(f"flowrl export: {err}") from None


def load_lora(policy: FlowPolicy, folder: str | Path, adapter: str = "exported") -> str:
    """Loads LoRA weights that :func:`export_lora` wrote (or any diffusers LoRA folder for the policy's denoiser) as
    the adapter ``adapter`` and makes it the active one; rank and alpha come from the file's metadata, so the
    policy's own ``lora`` options need not match. Returns the adapter's name.

    Raises:
        FileNotFoundError: ``folder`` holds no ``pytorch_lora_weights.safetensors``.
    """
    files = lora_modules(policy)
    if not any((Path(folder) / name).is_file() for name in files):
        raise FileNotFoundError(f"{Path(folder) / next(iter(files))} does not exist; pass a folder written by "
                                "`python -m flowrl export`")
    prefix = getattr(policy, "denoiser_name", "transformer")
    for name, module in files.items():
        if (Path(folder) / name).is_file():
            module.load_lora_adapter(str(folder), weight_name=name, prefix=prefix, adapter_name=adapter)
    policy.denoiser.set_adapter(adapter)
    return adapter
