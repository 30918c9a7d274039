"""Whether a checkpoint's weights fit the method and policy that are about to load it, said in one line.

A checkpoint records the method that wrote it (``flowrl_method``, written by every method's ``on_save_checkpoint``);
its weights tell the LoRA adapters and their rank. Before anything loads (``fit --ckpt_path``, ``predict``,
``export``), :func:`checkpoint_fit_problems` compares them with what the config will build: the method's adapters
(the policy's own ``default`` and the method's ``named_adapters``, e.g. TDM-R1's fake score and surrogate) and the
policy's LoRA rank, and names both methods and what is missing, instead of torch's list of every missing and
unexpected key. :func:`load_mismatch` says the same of two ``state_dict`` s once a model is built (a checkpoint that
records no method, a model that differs in more than its adapters).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

import torch

from flowrl.checkpoints.family import family_problem, method_path  # noqa: F401  method_path: re-exported
from flowrl.checkpoints.sharded import META, is_sharded_checkpoint
from flowrl.config_nodes import class_at, plain
from flowrl.policies.base import LoraOptions, adapter_of


def checkpoint_record(path: str | Path) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """``({state_dict key: shape}, the non-tensor entries)`` of a checkpoint file or sharded folder, read without
    loading its tensors (a file is memory-mapped; a folder's shapes come from its index, the rest from its meta.pt)."""
    path = Path(path)
    if is_sharded_checkpoint(path):
        from torch.distributed.checkpoint import FileSystemReader

        entries = FileSystemReader(str(path)).read_metadata().state_dict_metadata
        shapes = {k[len("state_dict."):]: tuple(getattr(v, "size", ())) for k, v in entries.items()
                  if k.startswith("state_dict.")}
        return shapes, torch.load(path / META, map_location="cpu", weights_only=False)
    checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=False)
    return {k: tuple(v.shape) for k, v in checkpoint.get("state_dict", {}).items()}, checkpoint


def checkpoint_weights(path: str | Path) -> tuple[dict[str, tuple[int, ...]], Optional[str]]:
    """``({state_dict key: shape}, the method recorded or None)`` of a checkpoint (:func:`checkpoint_record`)."""
    shapes, record = checkpoint_record(path)
    return shapes, record.get("flowrl_method")


def adapter_ranks(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """``{adapter: rank}`` of the LoRA weights among ``shapes`` (a ``lora_A`` weight is ``[rank, in]``).

    >>> adapter_ranks({"b.lora_A.default.weight": (4, 64), "b.lora_B.default.weight": (64, 4), "b.weight": (64, 64)})
    {'default': 4}
    """
    ranks: dict[str, int] = {}
    for key, shape in shapes.items():
        name = adapter_of(key)
        if name is not None and ".lora_A." in key and shape:
            ranks.setdefault(name, int(shape[0]))
    return ranks


def expected_rank(policy: Any) -> Optional[int]:
    """The LoRA rank a built policy or a parsed policy config ``{class_path, init_args}`` trains (None: full
    fine-tuning, or unknown).

    >>> expected_rank({"class_path": "flowrl.policies.TinyFlowPolicy", "init_args": {"lora": {"rank": 4}}})
    4
    """
    policy = plain(policy) if policy is not None else {}
    if not isinstance(policy, dict):
        return getattr(getattr(policy, "lora", None), "rank", None)
    init_args = plain(policy.get("init_args")) or {}
    if "lora" in init_args:
        lora = plain(init_args["lora"])
        if lora is None or lora == "None":
            return None
        return int((lora if isinstance(lora, dict) else vars(lora)).get("rank", LoraOptions().rank))
    cls = class_at(policy.get("class_path"))
    lora = inspect.signature(cls).parameters.get("lora") if cls is not None else None
    return getattr(lora.default, "rank", None) if lora is not None else None


def _listing(names) -> str:
    return ", ".join(sorted(names)) or "none"


#: how to load a checkpoint that does not fit the config, by what the command does with it
_FIXES = {"resume": "resume with the config it was trained with (the config.yaml beside it), or start a new run from "
                    "its weights: `python -m flowrl export --ckpt CKPT --out DIR` writes its LoRA folder",
          "predict": "leave --config out: predict reads the config.yaml beside the checkpoint",
          "export": "leave --config out: export reads the config.yaml beside the checkpoint"}


def checkpoint_fit_problems(ckpt: str, method: type | str, policy: Any, purpose: str) -> list[str]:
    """Problems loading checkpoint ``ckpt`` into ``method`` with ``policy`` (built, or a parsed policy config), for
    ``purpose`` (``resume``, ``predict`` or ``export``); ``[]`` when it fits or the checkpoint cannot be read (its
    own check names that). ``method``: the method's class (or built module), whose ``named_adapters`` must be in the
    checkpoint, or only its class path where no method adapter need fit (``export`` checks the trained ``default``
    adapter alone)."""
    try:
        shapes, record = checkpoint_record(ckpt)
    except Exception:  # noqa: BLE001  missing, cut off, not a checkpoint: checkpoint_problems says which
        return []
    saved_by = record.get("flowrl_method")
    if family := family_problem(ckpt, shapes, record.get("flowrl_policy"), policy):
        return [f"{family}. {_FIXES[purpose][0].upper()}{_FIXES[purpose][1:]}"]
    have, rank = adapter_ranks(shapes), expected_rank(policy)
    want = set() if rank is None else {"default", *getattr(method, "named_adapters", ())}
    if purpose == "export":  # export adds the checkpoint's other adapters itself: only the trained one must fit
        want = want & {"default"}
        have = {k: v for k, v in have.items() if k == "default" or k in want}
    missing = want - set(have)
    extra = set() if purpose == "export" else set(have) - want
    wrong_rank = sorted(k for k in set(have) & want if have[k] != rank)
    if not (missing or extra or wrong_rank):
        return []
    theirs = saved_by or "a method it does not record (an older flowrl)"
    held = ", ".join(f"{k} (rank {r})" for k, r in sorted(have.items())) or "none (full fine-tuning)"
    needs = f"the LoRA adapters {_listing(want)} at rank {rank}" if want else "full fine-tuning (no LoRA adapters)"
    what = [f"missing: {_listing(missing)}" if missing else "", f"not its own: {_listing(extra)}" if extra else "",
            f"rank {have[wrong_rank[0]]} in the checkpoint, {rank} in model.init_args.policy.init_args.lora.rank"
            if wrong_rank else ""]
    fix = _FIXES[purpose]
    return [f"ckpt_path={ckpt!r} was written by {theirs} (LoRA adapters: {held}); the config's {method_path(method)} "
            f"needs {needs}: {'; '.join(w for w in what if w)}. {fix[0].upper()}{fix[1:]}"]


def load_mismatch(saved: dict[str, tuple[int, ...]], model: dict[str, tuple[int, ...]], saved_by: Optional[str],
                  loading_as: str) -> Optional[str]:
    """One line on how the weights ``saved`` (a checkpoint's ``{key: shape}``) differ from ``model``'s (None: they
    fit): the methods and the adapters or weights that are missing, extra or of another shape.

    >>> load_mismatch({"a.lora_A.default.weight": (4, 8)}, {"a.lora_A.default.weight": (4, 8),
    ...     "a.lora_A.old.weight": (4, 8)}, "flowrl.methods.FlowGRPO", "flowrl.methods.DiffusionNFT")
    'the checkpoint (written by flowrl.methods.FlowGRPO) does not fit flowrl.methods.DiffusionNFT: missing the LoRA \
adapters old'
    """
    missing, extra = set(model) - set(saved), set(saved) - set(model)
    reshaped = sorted(k for k in set(saved) & set(model) if tuple(saved[k]) != tuple(model[k]))
    if not (missing or extra or reshaped):
        return None

    def grouped(keys) -> str:
        adapters = sorted({a for k in keys if (a := adapter_of(k)) is not None})
        others = sorted(k for k in keys if adapter_of(k) is None)
        parts = [f"the LoRA adapters {', '.join(adapters)}"] if adapters else []
        if others:
            parts.append(f"{len(others)} other weights (e.g. {others[0]})")
        return " and ".join(parts)

    what = [f"missing {grouped(missing)}" if missing else "", f"not its own: {grouped(extra)}" if extra else "",
            f"{len(reshaped)} weights of another shape (e.g. {reshaped[0]}: {tuple(saved[reshaped[0]])} in the "
            f"checkpoint, {tuple(model[reshaped[0]])} here; a LoRA rank or model that differs)" if reshaped else ""]
    return (f"the checkpoint (written by {saved_by or 'a method it does not record'}) does not fit {loading_as}: "
            f"{'; '.join(w for w in what if w)}")


def resume_step_problems(ckpt: str, max_steps: Any) -> list[str]:
    """A resume from ``ckpt`` that would train nothing: the checkpoint's step is already ``trainer.max_steps`` or
    more (resuming a finished run with its own command line). ``[]`` when ``max_steps`` sets no limit or the
    checkpoint cannot be read (its own check names that)."""
    if not isinstance(max_steps, int) or max_steps < 0:
        return []
    try:
        step = checkpoint_record(ckpt)[1].get("global_step")
    except Exception:  # noqa: BLE001  reported by checkpoint_problems
        return []
    if not isinstance(step, int) or step < max_steps:
        return []
    return [f"ckpt_path={ckpt!r} was saved at step {step} and trainer.max_steps={max_steps}: the resumed run would "
            f"train nothing; raise trainer.max_steps above {step} (it counts from the first run's start) to train "
            "on, or leave ckpt_path out to start a new run"]
