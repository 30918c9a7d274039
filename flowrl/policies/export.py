"""Write a trained policy as diffusers files, and read them back: the library half of ``python -m flowrl export``
(:mod:`flowrl.cli.export`).

LoRA weights go to ``pytorch_lora_weights.safetensors`` through the pipeline's own ``save_lora_weights`` (rank and
alpha in its metadata; Wan 2.2's low-noise expert to ``pytorch_lora_weights_transformer_2.safetensors``), a whole
pipeline (adapters fused, or full fine-tuning) through ``save_pretrained``; an export into a folder holding an
earlier one leaves exactly its own files there (:mod:`flowrl.policies.export_folder`). :func:`load_lora` loads such
a folder back as an adapter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from flowrl.policies.base import FlowPolicy
from flowrl.policies.export_folder import out_problem, staged

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
        # a pipeline without a LoRA loader of its own names the mixin that writes its layout (HunyuanVideo 1.5)
        writer = getattr(policy, "lora_writer", policy.pipeline_class)
        for weight_name, module in lora_modules(policy).items():
            writer.save_lora_weights(
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
