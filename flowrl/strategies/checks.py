"""Checks of ``trainer.strategy`` against the rest of a parsed ``fit`` config, before any weight loads.

Each problem names the setting and the fix. What they guard:

- FSDP2 (``fsdp2``) and ZeRO-3: every forward of the sharded denoiser is a collective, so ranks must draw the same
  number of validation batches.
- Lightning's FSDP1 (``fsdp``): not supported by the loop (flat parameters hide the per-parameter gradients the
  checked optimizer step and clipping read); ``fsdp2`` shards the same blocks and runs on CPU and GPU.
- DeepSpeed (``deepspeed_stage_2`` / ``_3``): an optional extra, CUDA only, one optimizer (not the likelihood-free
  methods, whose named adapters have one each), clipping inside its engine
  (its config's ``gradient_clipping``, not ``model.max_grad_norm``), and under ZeRO-3 no EMA of the weights (they
  live partitioned in the engine's buffers).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any, Optional

from flowrl.checkpoints.sharded import is_sharded_checkpoint
from flowrl.config_nodes import as_dict, with_defaults

FSDP2_CLASSES = ("FSDP2Strategy", "ModelParallelStrategy")
DEEPSPEED_FIX = "pip install 'flowrl[deepspeed]'"


def strategy_kind(strategy: Any) -> tuple[str, dict]:
    """``("fsdp2" | "fsdp" | "deepspeed" | "other", options)`` of a ``trainer.strategy`` value: a registered name
    or a ``{class_path, init_args}`` node.

    >>> strategy_kind("fsdp2")[0], strategy_kind("deepspeed_stage_3"), strategy_kind("ddp")[0]
    ('fsdp2', ('deepspeed', {'stage': 3}), 'other')
    """
    from lightning.pytorch.strategies import StrategyRegistry

    if isinstance(strategy, str):
        options = dict(StrategyRegistry[strategy]["init_params"]) if strategy in StrategyRegistry else {}
        name = strategy
    else:
        node = as_dict(strategy)
        name, options = str(node.get("class_path", "")).rpartition(".")[2], as_dict(node.get("init_args"))
    if name == "fsdp2" or name in FSDP2_CLASSES:
        return "fsdp2", options
    if name.startswith("fsdp") or name == "FSDPStrategy":
        return "fsdp", options
    if name.startswith("deepspeed") or name == "DeepSpeedStrategy":
        stage = as_dict(options.get("config")).get("zero_optimization", {}).get("stage", options.get("stage", 2))
        return "deepspeed", {**options, "stage": stage}
    return "other", options


def val_batch_counts(num_rows: int, batch_size: int, world: int) -> list[int]:
    """Validation batches on each rank (rank ``k`` takes rows ``k, k + world, ...``; ``flowrl.data.eval_batches``).

    >>> val_batch_counts(33, 16, 2), val_batch_counts(32, 16, 2)
    ([2, 1], [1, 1])
    """
    return [math.ceil(len(range(rank, num_rows, world)) / batch_size) for rank in range(world)]


def strategy_problems(config: dict, method: type, world: Optional[int], num_val_prompts: int) -> list[str]:
    """Problems of ``config["trainer"]["strategy"]`` with the method class, the process count ``world`` (None:
    unknown) and the number of validation prompts."""
    from flowrl.data import PromptDataModule

    trainer, model = as_dict(config.get("trainer")), as_dict(config.get("model"))
    data = with_defaults(PromptDataModule, config.get("data"))  # every data option, the declared default where unset
    kind, options = strategy_kind(trainer.get("strategy", "auto"))
    shown = trainer.get("strategy") if isinstance(trainer.get("strategy"), str) else options
    problems = []
    ckpt = config.get("ckpt_path")
    if ckpt and kind != "fsdp2" and is_sharded_checkpoint(Path(str(ckpt)).expanduser()):
        problems.append(f"ckpt_path={ckpt!r} is a sharded (FSDP2) checkpoint folder: resume it with "
                        "--trainer.strategy=fsdp2, or write its weights out with `python -m flowrl export --ckpt ...`")
    if kind == "fsdp":
        problems.append(f"trainer.strategy={shown!r} (Lightning's FSDP1) is not supported by flowrl's loop: its flat "
                        "parameters hide the per-parameter gradients the checked optimizer step reads; use "
                        "--trainer.strategy=fsdp2 (FSDP2 fully_shard of the same blocks, on CPU or GPU)")
    if kind == "deepspeed" and not _is_policy_gradient(method):
        problems.append(f"model.class_path={method.__name__} trains named adapters with one optimizer each and its "
                        f"own gradient reduction, which trainer.strategy={shown!r} (one optimizer in DeepSpeed's "
                        "engine) does not support; use --trainer.strategy=ddp, or fsdp2 to shard the weights")
    if kind == "fsdp2" and int(options.get("tensor_parallel_size", 1)) != 1:
        problems.append("trainer.strategy: flowrl shards with FSDP2 over data-parallel ranks only; set "
                        "tensor_parallel_size: 1 (or use --trainer.strategy=fsdp2)")
    if kind == "fsdp2" or (kind == "deepspeed" and options.get("stage") == 3):
        rows = num_val_prompts * int(data["val_samples_per_prompt"])
        size = int(data["val_batch_size"])
        counts = val_batch_counts(rows, size, world) if world and world > 1 and rows else []
        if len(set(counts)) > 1:
            problems.append(f"trainer.strategy={shown!r} runs each forward as a collective, so every rank must draw as "
                            f"many validation batches: {rows} validation samples over {world} ranks give "
                            f"{counts} batches of data.val_batch_size={size}; use data.val_batch_size="
                            f"{math.ceil(rows / world)} (one batch each) or a sample count divisible by "
                            f"{world * size}")
    if kind == "deepspeed":
        problems += _deepspeed_problems(trainer, with_defaults(method, model.get("init_args")), options, shown)
    return problems


def _deepspeed_problems(trainer: dict, init_args: dict, options: dict, shown: Any) -> list[str]:
    """``init_args``: the method's options, the declared default where the config sets none."""
    problems = []
    if importlib.util.find_spec("deepspeed") is None:
        problems.append(f"trainer.strategy={shown!r} needs DeepSpeed, which is not installed: {DEEPSPEED_FIX} (CUDA "
                        "GPUs only); or shard with --trainer.strategy=fsdp2, which needs nothing extra")
    if str(trainer.get("accelerator", "auto")) == "cpu":
        problems.append(f"trainer.strategy={shown!r} runs on CUDA GPUs only (Lightning's DeepSpeedStrategy); on "
                        "trainer.accelerator=cpu use --trainer.strategy=fsdp2 (sharded) or ddp")
    if init_args["max_grad_norm"] is not None:
        problems.append("model.max_grad_norm: DeepSpeed clips inside its engine, not through the strategy; set "
                        "--model.init_args.max_grad_norm=null and give the clip in DeepSpeed's config, e.g. "
                        "--trainer.strategy=lightning.pytorch.strategies.DeepSpeedStrategy "
                        "--trainer.strategy.config='{zero_optimization: {stage: 2}, gradient_clipping: 1.0}'")
    callbacks = [str(as_dict(c).get("class_path", "")) for c in trainer.get("callbacks") or []]
    if options.get("stage") == 3 and any(path.rpartition(".")[2] == "EMA" for path in callbacks):
        problems.append("flowrl.callbacks.EMA with DeepSpeed ZeRO-3: the EMA reads the trained weights, which ZeRO-3 "
                        "keeps partitioned inside its engine; use deepspeed_stage_2, or --trainer.strategy=fsdp2 "
                        "(EMA of each rank's shard)")
    return problems


def _is_policy_gradient(method: Any) -> bool:
    """Whether ``method`` (a class or a built module) trains with PPO's one optimizer (``uses_ppo``, set by
    :class:`~flowrl.methods.PolicyGradient`), read off it: the strategies sit below the methods and import none."""
    return bool(getattr(method, "uses_ppo", False))
