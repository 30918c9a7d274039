"""The models of an evaluation, loaded: one backbone (the base config's policy) with each LoRA model as a named
adapter on it, so that N tuned models cost one copy of the base weights; the base model is the backbone without
adapters (:meth:`~flowrl.policies.base.FlowPolicy.reference`). A fully fine-tuned checkpoint cannot be an adapter and
loads as a policy of its own.

A LoRA fit checkpoint's generator is its ``default`` adapter (the one the policy's ``lora`` option creates and every
method samples from; a method's own adapters, such as TDM-R1's fake score, are not models); it is added with the
rank, alpha and targets of its run's config. A LoRA folder with the adapter's metadata (``python -m flowrl
export``) loads through diffusers with its own rank and alpha; one without (``save_adapter``) takes the base config's.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from flowrl.evaluation.sources import BASE, WEIGHTS_NAME, Source, policy_spec
from flowrl.policies.base import DEFAULT_ADAPTER, FlowPolicy, LoraOptions, adapter_of

#: the prefix of a tuned model's adapter on the backbone (a model named ``default`` must not meet the policy's own)
ADAPTER_PREFIX = "evaluate_"


@dataclass
class Model:
    """One model to draw from: ``policy`` (the backbone or a fully fine-tuned policy) and ``active``, the context in
    which that policy is this model."""

    name: str
    policy: FlowPolicy
    active: Callable[[], AbstractContextManager]


def build_policy(spec: dict, lora_default: bool = False, load: bool = True) -> FlowPolicy:
    """The policy of a config's ``model.init_args.policy`` spec (its frozen weights load here unless ``load`` is
    False). ``lora_default``: a spec without LoRA gets the default options, so that adapters attach and
    ``reference()`` is the bare backbone."""
    from flowrl.checkpoints.loading import policy_from_spec

    spec = {"class_path": spec["class_path"], "init_args": dict(spec.get("init_args") or {})}
    if lora_default and spec["init_args"].get("lora") is None:
        spec["init_args"]["lora"] = {}
    return policy_from_spec(spec, load=load)


def checkpoint_state(path: Path, ema: bool = False) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a fit checkpoint (a file, or a sharded checkpoint's folder gathered whole); ``ema``: with
    the average a ``flowrl.callbacks.EMA`` kept in place of the trained weights it covers."""
    from flowrl.checkpoints.loading import ema_weights, read_checkpoint

    checkpoint = read_checkpoint(path)
    state = checkpoint["state_dict"]
    return {**state, **{k: v.to(state[k].dtype) for k, v in ema_weights(checkpoint).items()}} if ema else state


def generator_weights(state: dict[str, torch.Tensor], adapter: str = DEFAULT_ADAPTER) -> dict[str, torch.Tensor]:
    """Adapter ``adapter``'s weights in a method's ``state_dict``, keyed as peft keys one adapter's state.

    >>> w = generator_weights({"policy.denoiser.b.to_q.lora_A.default.weight": torch.ones(1),
    ...                        "policy.denoiser.b.to_q.lora_A.fake_score.weight": torch.zeros(1),
    ...                        "policy.denoiser.b.to_q.base_layer.weight": torch.zeros(1)})
    >>> list(w)
    ['b.to_q.lora_A.weight']
    """
    prefix, out = "policy.denoiser.", {}
    for key, value in state.items():
        if key.startswith(prefix) and adapter_of(key) == adapter:
            parts = key[len(prefix):].split(".")
            i = next(i for i, p in enumerate(parts) if p.startswith("lora_") and parts[i + 1] == adapter)
            out[".".join(parts[:i + 1] + parts[i + 2:])] = value
    return out


def lora_options(spec: dict) -> Optional[LoraOptions]:
    """The LoRA options of a policy spec (None: full fine-tuning), without ``init`` (trained weights replace it)."""
    lora = (spec.get("init_args") or {}).get("lora")
    if lora is None:
        return None
    return LoraOptions(**{k: v for k, v in dict(lora).items() if k != "init"})


def has_adapter_metadata(folder: Path) -> bool:
    """Whether a LoRA folder's weights carry diffusers' adapter metadata (rank, alpha, targets)."""
    from safetensors import safe_open

    with safe_open(str(folder / WEIGHTS_NAME), framework="pt") as f:
        return "lora_adapter_metadata" in (f.metadata() or {})


class ForeignLora(ValueError):
    """A LoRA folder whose weights adapt none of the base model's modules: a LoRA of another model family."""


def foreign_lora(policy: FlowPolicy, base_spec: dict, folder: Path) -> Optional[str]:
    """Why ``folder``'s LoRA cannot sit on ``policy`` (None: it can): none of the modules its files adapt is a module
    of the base's denoiser. Read from the files' keys and the denoiser's config (:mod:`flowrl.policies.skeleton`), so
    before any weight loads (peft would end in its bare ``NoMatchingPeftModuleError``, or the adapter check in a list
    of keys, naming neither model)."""
    from safetensors import safe_open

    from flowrl.policies.skeleton import denoiser_module_names

    prefix = getattr(policy, "denoiser_name", "transformer") + "."
    adapted: set[str] = set()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            adapted |= {k.removeprefix(prefix).split(".lora_A")[0] for k in f.keys() if ".lora_A" in k}
    if not adapted or adapted & denoiser_module_names(policy):
        return None
    init_args = base_spec.get("init_args") or {}
    return (f"the LoRA folder {folder} adapts modules the base model's denoiser has not (e.g. {min(adapted)}; the "
            f"base is {base_spec.get('class_path')} on {init_args.get('model')}): a LoRA of another model family; "
            "evaluate it against its own base model (--config with the config of the run that trained it)")


def add_folder(backbone: FlowPolicy, base_spec: dict, adapter: str, folder: Path) -> None:
    """A LoRA folder as the adapter ``adapter``: with its metadata's rank and alpha, or without metadata the base
    config's LoRA options."""
    from flowrl.policies.adapter_weights import load_adapter
    from flowrl.policies.export import load_lora

    if has_adapter_metadata(folder):
        load_lora(backbone, folder, adapter)
    else:
        backbone.add_adapter(adapter, lora_options(base_spec) or LoraOptions(), trainable=False)
        load_adapter(backbone, adapter, str(folder))


def add_source(backbone: FlowPolicy, base_spec: dict, source: Source, ema: bool = False) -> Model:
    """``source`` as a model: an adapter on ``backbone``, or (full fine-tuning) a policy of its own; ``ema``: a
    checkpoint's EMA average instead of its trained weights."""
    from flowrl.policies.adapter_weights import set_adapter_state

    adapter = ADAPTER_PREFIX + source.name
    if source.kind == "lora":
        add_folder(backbone, base_spec, adapter, source.path)
    elif (options := lora_options(policy_spec(source.config))) is not None:
        backbone.add_adapter(adapter, options, trainable=False)
        set_adapter_state(backbone, adapter, generator_weights(checkpoint_state(source.path, ema)),
                          f"{source.name}={source.path}")
    else:
        from flowrl.checkpoints.loading import load_policy

        policy = load_policy(source.path, source.config_path, ema).requires_grad_(False).eval()
        return Model(source.name, policy, nullcontext)
    return Model(source.name, backbone, lambda: backbone.adapter(adapter))


def load_models(base_spec: dict, sources: list[Source], base_lora: Optional[Path] = None,
                ema: bool = False) -> list[Model]:
    """The base model and every source, in order; the LoRA ones on one backbone built from ``base_spec``; ``ema``:
    each checkpoint's EMA average instead of its trained weights.

    The base is the backbone alone, or the backbone with ``base_lora`` (a distilled few-step generator such as
    ``flowrl/tiny-digits-k4``, where TDM-R1 starts), or with the LoRA the policy's ``lora.init`` starts from.

    Raises:
        ForeignLora: a LoRA folder's weights adapt none of the base's modules (:func:`foreign_lora`), found before
            any weight loads.
    """
    backbone = build_policy(base_spec, lora_default=True, load=False)
    folders = [base_lora] if base_lora is not None else []
    for folder in [*folders, *(s.path for s in sources if s.kind == "lora")]:
        if (why := foreign_lora(backbone, base_spec, folder)) is not None:
            raise ForeignLora(why)
    backbone = backbone.load().requires_grad_(False).eval()
    starts_from = (base_spec.get("init_args") or {}).get("lora")
    initial = isinstance(starts_from, dict) and starts_from.get("init") is not None
    base = Model(BASE, backbone, (lambda: backbone.adapter(DEFAULT_ADAPTER)) if initial else backbone.reference)
    with warnings.catch_warnings():  # several adapters on one backbone are the point; peft warns at the second
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute in the model")
        if base_lora is not None:
            add_folder(backbone, base_spec, ADAPTER_PREFIX + BASE, base_lora)
            base = Model(BASE, backbone, lambda: backbone.adapter(ADAPTER_PREFIX + BASE))
        models = [base, *[add_source(backbone, base_spec, s, ema) for s in sources]]
    backbone.requires_grad_(False)  # adding an adapter marks the backbone's flags again; nothing here trains
    return models
