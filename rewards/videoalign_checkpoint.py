"""Reading a VideoAlign checkpoint folder (``KwaiVGI/VideoReward``): its ``model_config.json`` and the weights of one
``checkpoint-<step>`` in it, as the authors' ``inference.py`` and ``utils.load_model_from_checkpoint`` read them
(github.com/KwaiVGI/VideoAlign).

The folder holds ``model_config.json`` (``data_config``: fps, frames, max pixels, the prompt template;
``model_config``: the base Qwen2-VL and the reward head; ``peft_lora_config``; ``inference_config``: the score
normalisation) and ``checkpoint-<step>/`` folders; the latest step is used unless one is asked for. A step holds
either the whole model (``model.pth``) or a LoRA adapter (``adapter_model.safetensors``) with the weights trained in
full beside it (``non_lora_state_dict.pth``). flowrl merges the adapter into the base weights on load (the same
function at inference; no peft wrapper), and renames the authors' transformers-4.45 keys (``model.layers.*``,
``visual.*``) to transformers 5's (``model.language_model.layers.*``, ``model.visual.*``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

REQUIRED = {"data_config": ("fps", "max_frame_pixels", "prompt_template_type"),
            "model_config": ("model_name_or_path", "output_dim", "reward_token")}


def config_problems(folder: str) -> list[str]:
    """Why a local folder is not a VideoAlign checkpoint (no ``model_config.json``, a config without the keys the
    reward reads, no ``checkpoint-<step>``), found without reading any weight.

    >>> config_problems("/no/such/folder")  # doctest: +ELLIPSIS
    ["'/no/such/folder' has no model_config.json: ...
    """
    root, problems = Path(folder), []
    if not (root / "model_config.json").is_file():
        return [f"{folder!r} has no model_config.json: pass the folder of a VideoAlign checkpoint (the hub's "
                f"KwaiVGI/VideoReward, or a folder the authors' train_reward.py wrote)"]
    try:
        config = json.loads((root / "model_config.json").read_text())
    except ValueError as err:
        return [f"{folder}/model_config.json is not JSON ({err})"]
    for section, keys in REQUIRED.items():
        missing = [k for k in keys if k not in config.get(section, {})]
        if missing:
            problems.append(f"{folder}/model_config.json lacks {section}.{', '.join(missing)}")
    if not checkpoint_steps(root):
        problems.append(f"{folder!r} has no checkpoint-<step> folder with the weights (model.pth, or "
                        f"adapter_model.safetensors and non_lora_state_dict.pth)")
    return problems


def checkpoint_steps(root: Path) -> list[int]:
    """The steps of the ``checkpoint-<step>`` folders in ``root``, latest first."""
    steps = [int(p.name.split("-")[-1]) for p in root.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)]
    return sorted(steps, reverse=True)


def read_config(folder: str) -> dict[str, Any]:
    """``model_config.json`` of a checkpoint folder (raises ``ValueError`` listing :func:`config_problems`)."""
    if problems := config_problems(folder):
        raise ValueError("VideoReward checkpoint: " + "; ".join(problems))
    return json.loads((Path(folder) / "model_config.json").read_text())


def checkpoint_dir(folder: str, step: Optional[int] = None) -> Path:
    """``checkpoint-<step>``, or the latest one when ``step`` is None (the authors' ``load_from_pretrained_step=-1``).

    Raises:
        FileNotFoundError: ``step`` is not in the folder (the authors fall back to the latest; flowrl says so).
    """
    steps = checkpoint_steps(Path(folder))
    if step is not None and step not in steps:
        raise FileNotFoundError(f"VideoReward checkpoint {folder!r} has no checkpoint-{step}; it has steps {steps}")
    return Path(folder) / f"checkpoint-{steps[0] if step is None else step}"


def lora_scale(peft: dict[str, Any]) -> float:
    """peft's LoRA scaling: ``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA.

    >>> lora_scale({"lora_r": 64, "lora_alpha": 128}), lora_scale({"lora_r": 64, "lora_alpha": 128, "use_rslora": True})
    (2.0, 16.0)
    """
    r, alpha = peft["lora_r"], peft["lora_alpha"]
    return alpha / math.sqrt(r) if peft.get("use_rslora") else alpha / r


def merged_state_dict(step_dir: Path, peft: dict[str, Any], base: dict[str, Tensor]) -> dict[str, Tensor]:
    """The weights a checkpoint step gives, in the authors' key layout without peft's prefixes: ``model.pth`` as it
    is; else ``base`` (the base model's state dict, same layout) updated by the fully trained weights and with each
    LoRA pair merged, ``W + scale * B @ A``.

    Raises:
        FileNotFoundError: the step has neither form.
    """
    if (step_dir / "model.pth").is_file():
        return torch.load(step_dir / "model.pth", map_location="cpu", weights_only=True)
    adapter, full = step_dir / "adapter_model.safetensors", step_dir / "non_lora_state_dict.pth"
    if not (adapter.is_file() and full.is_file()):
        raise FileNotFoundError(f"{step_dir} holds neither model.pth nor adapter_model.safetensors with "
                                f"non_lora_state_dict.pth")
    from safetensors.torch import load_file

    merged = dict(base)
    merged.update({_unwrap(k): v for k, v in torch.load(full, map_location="cpu", weights_only=True).items()})
    lora, scale = {_unwrap(k): v for k, v in load_file(str(adapter)).items()}, lora_scale(peft)
    for key in [k for k in lora if ".lora_A." in k]:
        weight = key.replace(".lora_A.weight", ".weight").replace(".lora_A.", ".")
        down, up = lora[key].float(), lora[key.replace(".lora_A.", ".lora_B.")].float()
        merged[weight] = (merged[weight].float() + scale * up @ down).to(merged[weight].dtype)
    return merged


def _unwrap(key: str) -> str:
    """A peft key without its wrapper: ``base_model.model.x.lora_A.default.weight`` -> ``x.lora_A.weight``."""
    key = key.removeprefix("base_model.model.")
    return re.sub(r"\.(lora_[AB])\.default\.", r".\1.", key).replace(".base_layer.", ".")


def to_transformers5(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keys of a transformers-4.45 ``Qwen2VLForConditionalGeneration`` (+ ``rm_head``) in transformers 5's layout.

    >>> sorted(to_transformers5({"model.layers.0.mlp.up_proj.weight": 0, "visual.merger.mlp.0.weight": 0,
    ...                          "lm_head.weight": 0, "rm_head.weight": 0, "model.norm.weight": 0}))
    ['lm_head.weight', 'model.language_model.layers.0.mlp.up_proj.weight', 'model.language_model.norm.weight', \
'model.visual.merger.mlp.0.weight', 'rm_head.weight']
    """
    def rename(key: str) -> str:
        if key.startswith("visual."):
            return "model." + key
        if key.startswith("model.") and not key.startswith(("model.language_model.", "model.visual.")):
            return "model.language_model." + key[len("model."):]
        return key

    return {rename(k): v for k, v in state.items()}


def to_transformers4(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`to_transformers5` (the layout the authors' checkpoints are written in)."""
    def rename(key: str) -> str:
        if key.startswith("model.visual."):
            return key[len("model."):]
        return key.replace("model.language_model.", "model.", 1)

    return {rename(k): v for k, v in state.items()}
