"""One named LoRA adapter's weights to and from a folder in the diffusers layout
(``pytorch_lora_weights.safetensors``, keys ``transformer.<module>.lora_A.weight``), so that an adapter can start from
weights trained elsewhere (TDM-R1's few-step generator) and be read by ``pipe.load_lora_weights``.
"""

from __future__ import annotations

from pathlib import Path

from flowrl.model_paths import resolve_model
from flowrl.policies.base import FlowPolicy

WEIGHTS_NAME = "pytorch_lora_weights.safetensors"


def _prefix(policy: FlowPolicy) -> str:
    return getattr(policy, "denoiser_name", "transformer") + "."


def _check_adapter(policy: FlowPolicy, name: str) -> None:
    if name not in policy.adapter_names:
        raise ValueError(f"the policy has no adapter {name!r}; its adapters: {policy.adapter_names}")


def save_adapter(policy: FlowPolicy, name: str, out: str | Path) -> Path:
    """Writes adapter ``name``'s LoRA weights to ``out/pytorch_lora_weights.safetensors``; returns the file."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    _check_adapter(policy, name)
    state = get_peft_model_state_dict(policy.denoiser, adapter_name=name)
    Path(out).mkdir(parents=True, exist_ok=True)
    file = Path(out) / WEIGHTS_NAME
    save_file({_prefix(policy) + k: v.detach().contiguous().cpu() for k, v in state.items()}, str(file))
    return file


def load_adapter(policy: FlowPolicy, name: str, source: str) -> None:
    """Loads LoRA weights saved by :func:`save_adapter` (or diffusers' ``save_lora_weights``) into adapter ``name``;
    ``source`` is the file, its folder, or an embedded ``flowrl/<name>`` folder. A ``.ckpt``/``.pt`` file holding
    ``{"ema_parameters": [tensor, ...]}`` (the TDM-R1 code's EMA checkpoints, e.g. its TDM LoRA of SD3.5-M
    ``Luo-Yihong/TDM_sd3-5_lora``) is read as the adapter's parameters in module order, shapes checked (not tested
    against the published file, which cannot be downloaded here).

    Raises:
        FileNotFoundError: no weights at ``source``. ValueError: the weights do not fit the adapter (another rank,
            other target modules or another model).
    """
    import torch
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    _check_adapter(policy, name)
    path = Path(resolve_model(source))
    file = path / WEIGHTS_NAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no LoRA weights at {source!r} (looked for {file})")
    expected = get_peft_model_state_dict(policy.denoiser, adapter_name=name)
    if file.suffix in (".ckpt", ".pt"):
        loaded = dict(zip(expected, torch.load(file, map_location="cpu", weights_only=True)["ema_parameters"]))
        if len(loaded) != len(expected):
            raise ValueError(f"{source!r} holds {len(loaded)} tensors; adapter {name!r} has {len(expected)}")
    else:
        prefix = _prefix(policy)
        loaded = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in load_file(str(file)).items()}
    set_adapter_state(policy, name, loaded, repr(source))


def set_adapter_state(policy: FlowPolicy, name: str, loaded: dict, source: str) -> None:
    """Sets adapter ``name``'s LoRA weights from ``loaded``, keyed as peft's ``get_peft_model_state_dict`` keys them
    (``<module>.lora_A.weight``); ``source`` names where they came from in the error.

    Raises:
        ValueError: the weights do not fit the adapter (another rank, other target modules or another model).
    """
    import torch
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    _check_adapter(policy, name)
    expected = get_peft_model_state_dict(policy.denoiser, adapter_name=name)
    wrong = sorted(set(loaded) ^ set(expected)) or [k for k in expected if loaded[k].shape != expected[k].shape]
    if wrong:
        raise ValueError(f"the LoRA weights at {source} do not fit adapter {name!r} (e.g. {wrong[:2]}); give "
                         "weights of the same model, LoRA rank and target modules")
    with torch.no_grad():
        set_peft_model_state_dict(policy.denoiser, loaded, adapter_name=name)
