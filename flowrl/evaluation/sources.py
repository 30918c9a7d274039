"""The models of an evaluation as the user names them (``--ckpt_path tuned=runs/.../last.ckpt other=lora/``), read
and checked without loading any weight: names, paths, the run configs beside the checkpoints, and whether every model
shares the base model.

A source is a fit checkpoint (a ``.ckpt`` file, or the folder of a sharded FSDP2 checkpoint), whose run's
``config.yaml`` LightningCLI saved beside ``checkpoints/``, or a LoRA folder (``pytorch_lora_weights.safetensors``,
as ``python -m flowrl export`` or :func:`flowrl.policies.adapter_weights.save_adapter` write it), which takes the
base config's policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from flowrl.checkpoints.paths import run_config

#: the name the model without trained weights always has
BASE = "base"
WEIGHTS_NAME = "pytorch_lora_weights.safetensors"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Source:
    """A tuned model: its ``name``, its ``path``, its ``kind`` (``"checkpoint"`` or ``"lora"``) and its run's
    resolved ``config`` (None for a LoRA folder, which uses the base config's policy) read from ``config_path``."""

    name: str
    path: Path
    kind: str
    config: Optional[dict] = None
    config_path: Optional[Path] = None


def split_names(values: list[str]) -> list[tuple[str, str]]:
    """``NAME=PATH`` values as ``(name, path)``; a bare path is named ``tuned`` (``tuned2``, ... for several). A
    path with ``=`` in a folder name is a path: a name holds no ``/``.

    >>> split_names(["a=x.ckpt", "runs/lr=0.1/last.ckpt", "y/"])
    [('a', 'x.ckpt'), ('tuned', 'runs/lr=0.1/last.ckpt'), ('tuned2', 'y/')]
    """
    out, unnamed = [], 0
    for value in values:
        name, eq, path = value.partition("=")
        if eq and "/" not in name:
            out.append((name, path))
            continue
        unnamed += 1
        out.append((f"tuned{unnamed if unnamed > 1 else ''}", value))
    return out


def name_problems(names: list[str]) -> list[str]:
    """Names that cannot label a model: not an identifier-like word, ``base``, or taken twice.

    >>> name_problems(["tuned", "base", "a.b", "tuned"])  # doctest: +NORMALIZE_WHITESPACE
    ["--ckpt_path base=...: 'base' is the model without trained weights, always evaluated; name this one otherwise",
     "--ckpt_path a.b=...: a name is a letter then letters, digits, '_' or '-'",
     "--ckpt_path tuned=...: two models are named 'tuned'; give each its own NAME=PATH"]
    """
    problems = []
    for i, name in enumerate(names):
        if name == BASE:
            problems.append(f"--ckpt_path {name}=...: 'base' is the model without trained weights, always evaluated; "
                            "name this one otherwise")
        elif not _NAME.fullmatch(name):
            problems.append(f"--ckpt_path {name}=...: a name is a letter then letters, digits, '_' or '-'")
        elif name in names[:i]:
            problems.append(f"--ckpt_path {name}=...: two models are named {name!r}; give each its own NAME=PATH")
    return problems


def read_config(path: Path) -> dict:
    """A fit config as a plain dict with its omegaconf interpolations resolved."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}


def policy_spec(config: dict) -> dict:
    """``model.init_args.policy`` of a fit config (``{}`` if missing)."""
    return ((config.get("model") or {}).get("init_args") or {}).get("policy") or {}


def base_model(config: dict) -> tuple[str, str]:
    """What makes two runs share a base model: the policy's class and the weights it loads (``init_args.model``,
    resolved as the policy resolves it; the class's default where the config names none)."""
    from flowrl.config_nodes import as_dict, class_at, with_defaults
    from flowrl.model_paths import resolve_model

    spec = policy_spec(config)
    class_path = spec.get("class_path", "")
    cls = class_at(class_path)
    model = (with_defaults(cls, spec.get("init_args")) if isinstance(cls, type) else as_dict(spec.get("init_args"))
             ).get("model")
    try:
        model = resolve_model(model) if isinstance(model, str) else model
    except FileNotFoundError:
        pass  # reported with the config's own problems when it loads
    return class_path.rpartition(".")[2], str(Path(model).resolve()) if model and Path(model).exists() else str(model)


def _kind(name: str, value: str, path: Path) -> tuple[Optional[str], list[str]]:
    """``"checkpoint"`` or ``"lora"``, or the problem with ``--ckpt_path name=value``."""
    from flowrl.checkpoints.paths import checkpoint_problems
    from flowrl.checkpoints.sharded import is_sharded_checkpoint

    what = "pass a fit checkpoint (runs/<name>/version_N/checkpoints/last.ckpt), a sharded checkpoint's folder or a "
    what += "LoRA folder (python -m flowrl export --out FOLDER)"
    if not path.exists():
        return None, [f"--ckpt_path {name}={value} does not exist (relative paths start at {Path.cwd()}); {what}"]
    if path.is_dir():
        if (path / WEIGHTS_NAME).is_file():
            return "lora", []
        if is_sharded_checkpoint(path):
            return "checkpoint", []
        return None, [f"--ckpt_path {name}={value}: a folder with neither {WEIGHTS_NAME} nor a sharded checkpoint; "
                      f"{what}"]
    if wrong := checkpoint_problems(str(path)):  # empty, or not a torch.save archive: its own words say which
        return None, [f"--ckpt_path {name}={value}: " + wrong[0].split(" ", 1)[1].split("; ")[0] + f"; {what}"]
    return "checkpoint", []


def read_sources(values: list[str], config: Optional[Path]) -> tuple[list[Source], list[str]]:
    """The sources of ``--ckpt_path`` values and every problem with them; ``config`` is ``--config`` (the base
    config, also the run config of a checkpoint that has none beside it)."""
    named = split_names(values)
    problems = name_problems([n for n, _ in named])
    sources = []
    for name, value in named:
        path = Path(value).expanduser()
        kind, wrong = _kind(name, value, path)
        problems += wrong
        if kind is None:
            continue
        found = run_config(path) if kind == "checkpoint" else None
        found = found or (config if kind == "checkpoint" else None)
        if kind == "checkpoint" and found is None:
            problems.append(f"--ckpt_path {name}={value}: no config.yaml beside it or in its run folder; pass the "
                            "run's config with --config")
            continue
        try:
            run = read_config(found) if found else None
        except Exception as err:  # omegaconf's and yaml's errors share no base class worth naming
            problems.append(f"--ckpt_path {name}={value}: its config {found} cannot be read: {err}")
            continue
        if run is not None and not policy_spec(run):
            problems.append(f"--ckpt_path {name}={value}: its config {found} has no model.init_args.policy; pass the "
                            "config of the run that wrote the checkpoint with --config")
            continue
        sources.append(Source(name, path, kind, run, found))
    return sources, problems


def base_problems(base: dict, base_path: Any, sources: list[Source]) -> list[str]:
    """Checkpoints whose run trained another base model than the base config's (different policy class or weights):
    their images are not comparable, and their LoRA weights would not fit the backbone."""
    want = base_model(base)
    problems = []
    for source in sources:
        if source.config is not None and (have := base_model(source.config)) != want:
            problems.append(f"--ckpt_path {source.name}={source.path}: trained {have[0]} on {have[1]}, but the base "
                            f"model ({base_path}) is {want[0]} on {want[1]}; evaluate models of one base together "
                            "(separate runs for the others), or pass that base's config with --config")
    return problems
