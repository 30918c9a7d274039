"""Checks of the trainer's strategy against the built method and data module, before any weight loads.

Each problem names the setting and the fix. They read the built trainer (its ``strategy`` object, devices, nodes,
callbacks and accelerator), or, where Lightning refuses to build it (DeepSpeed not installed, a GPU config on a
machine without one), its parsed options in the same attributes (:func:`flowrl.cli.run_checks.parsed_trainer`: the
strategy then a registered name or a built object). What they guard:

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
from flowrl.strategies.context_parallel import context_parallel_run_problems, data_parallel_size

FSDP2_CLASSES = ("FSDP2Strategy", "ModelParallelStrategy")
DEEPSPEED_FIX = "pip install 'flowrl[deepspeed]'"


def strategy_kind(strategy: Any) -> tuple[str, dict]:
    """``("fsdp2" | "fsdp" | "deepspeed" | "other", options)`` of a trainer's strategy: a registered name or a built
    ``Strategy`` (its class and the options the checks read: ``tensor_parallel_size``, DeepSpeed's ``stage``).

    >>> strategy_kind("fsdp2")[0], strategy_kind("deepspeed_stage_3"), strategy_kind("ddp")[0]
    ('fsdp2', ('deepspeed', {'stage': 3}), 'other')
    >>> from flowrl.strategies.fsdp2 import FSDP2Strategy
    >>> strategy_kind(FSDP2Strategy(tensor_parallel_size=2))
    ('fsdp2', {'tensor_parallel_size': 2})
    """
    from lightning.pytorch.strategies import StrategyRegistry

    if isinstance(strategy, str):
        options = dict(StrategyRegistry[strategy]["init_params"]) if strategy in StrategyRegistry else {}
        name = strategy
    else:  # a built strategy: its own class or the Lightning class it extends names it
        names = [k.__name__ for k in type(strategy).__mro__]
        name = next((n for n in names if n in (*FSDP2_CLASSES, "FSDPStrategy", "DeepSpeedStrategy")), names[0])
        options = {"tensor_parallel_size": getattr(strategy, "_tensor_parallel_size", 1)}
        if getattr(strategy, "context_parallel_size", 1) != 1:  # flowrl's FSDP2Strategy splitting one clip
            options.update(context_parallel_size=strategy.context_parallel_size,
                           context_parallel_attention=strategy.context_parallel_attention)
        if isinstance(config := getattr(strategy, "config", None), dict):  # DeepSpeed's, stage in zero_optimization
            options["config"] = config
    if name == "fsdp2" or name in FSDP2_CLASSES:
        return "fsdp2", options
    if name.startswith("fsdp") or name == "FSDPStrategy":
        return "fsdp", options
    if name.startswith("deepspeed") or name == "DeepSpeedStrategy":
        stage = (options.get("config") or {}).get("zero_optimization", {}).get("stage", options.get("stage", 2))
        return "deepspeed", {**options, "stage": stage}
    return "other", options


def val_batch_counts(num_rows: int, batch_size: int, world: int) -> list[int]:
    """Validation batches on each rank (rank ``k`` takes rows ``k, k + world, ...``; ``flowrl.data.eval_batches``).

    >>> val_batch_counts(33, 16, 2), val_batch_counts(32, 16, 2)
    ([2, 1], [1, 1])
    """
    return [math.ceil(len(range(rank, num_rows, world)) / batch_size) for rank in range(world)]


def strategy_problems(trainer: Any, module: Any, data: Any, ckpt: Optional[str] = None,
                      given: Any = None) -> list[str]:
    """Problems of ``trainer``'s strategy (the built ``Trainer``, or :func:`~flowrl.cli.run_checks.parsed_trainer`)
    with the built method ``module`` (or its class, where it could not be built), the data module ``data`` and the
    checkpoint ``ckpt``; ``given``: the strategy as the config writes it, which the messages show (default: the
    trainer's own)."""
    from flowrl.data import load_prompts

    strategy = trainer.strategy
    kind, options = strategy_kind(strategy)
    given = strategy if given is None else given
    shown = given if isinstance(given, str) else type(strategy).__name__
    world = trainer.num_devices * trainer.num_nodes if trainer.num_devices is not None else None
    method = module if isinstance(module, type) else type(module)
    problems = []
    if ckpt and kind != "fsdp2" and is_sharded_checkpoint(Path(str(ckpt)).expanduser()):
        problems.append(f"ckpt_path={ckpt!r} is a sharded (FSDP2) checkpoint folder: resume it with "
                        "--trainer.strategy=fsdp2, or write its weights out with `python -m flowrl export --ckpt ...`")
    if kind == "fsdp":
        problems.append(f"trainer.strategy={shown!r} (Lightning's FSDP1) is not supported by flowrl's loop: its flat "
                        "parameters hide the per-parameter gradients the checked optimizer step reads; use "
                        "--trainer.strategy=fsdp2 (FSDP2 fully_shard of the same blocks, on CPU or GPU)")
    if kind == "deepspeed" and not _is_policy_gradient(module):
        problems.append(f"model.class_path={method.__name__} trains named adapters with one optimizer each and its "
                        f"own gradient reduction, which trainer.strategy={shown!r} (one optimizer in DeepSpeed's "
                        "engine) does not support; use --trainer.strategy=ddp, or fsdp2 to shard the weights")
    if kind == "fsdp2" and int(options.get("tensor_parallel_size", 1)) != 1:
        problems.append("trainer.strategy: flowrl shards with FSDP2 over data-parallel ranks only; set "
                        "tensor_parallel_size: 1 (or use --trainer.strategy=fsdp2)")
    if kind == "fsdp2" and int(options.get("context_parallel_size", 1)) != 1:
        problems += context_parallel_run_problems(getattr(module, "policy", None), options, world)
    if kind == "fsdp2" or (kind == "deepspeed" and options.get("stage") == 3):
        try:
            prompts = len(load_prompts(data.val_source)) if data.val_source is not None else 0
        except (OSError, ValueError):  # reported with the config's problems
            prompts = 0
        rows, size = prompts * int(data.val_samples_per_prompt), int(data.val_batch_size)
        world = data_parallel_size(strategy, world) if world else world  # a context-parallel group shares batches
        counts = val_batch_counts(rows, size, world) if world and world > 1 and rows else []
        if len(set(counts)) > 1:
            problems.append(f"trainer.strategy={shown!r} runs each forward as a collective, so every rank must draw as "
                            f"many validation batches: {rows} validation samples over {world} ranks give "
                            f"{counts} batches of data.val_batch_size={size}; use data.val_batch_size="
                            f"{math.ceil(rows / world)} (one batch each) or a sample count divisible by "
                            f"{world * size}")
    if kind == "deepspeed":
        problems += _deepspeed_problems(trainer, getattr(module, "max_grad_norm", None), options, shown)
    return problems


def _deepspeed_problems(trainer: Any, max_grad_norm: Optional[float], options: dict, shown: Any) -> list[str]:
    """``max_grad_norm``: the built method's (None: no clipping, or the method could not be built)."""
    problems = []
    if importlib.util.find_spec("deepspeed") is None:
        problems.append(f"trainer.strategy={shown!r} needs DeepSpeed, which is not installed: {DEEPSPEED_FIX} (CUDA "
                        "GPUs only); or shard with --trainer.strategy=fsdp2, which needs nothing extra")
    accelerator = trainer.accelerator
    if accelerator == "cpu" or type(accelerator).__name__ == "CPUAccelerator":
        problems.append(f"trainer.strategy={shown!r} runs on CUDA GPUs only (Lightning's DeepSpeedStrategy); on "
                        "trainer.accelerator=cpu use --trainer.strategy=fsdp2 (sharded) or ddp")
    if max_grad_norm is not None:
        problems.append("model.max_grad_norm: DeepSpeed clips inside its engine, not through the strategy; set "
                        "--model.init_args.max_grad_norm=null and give the clip in DeepSpeed's config, e.g. "
                        "--trainer.strategy=lightning.pytorch.strategies.DeepSpeedStrategy "
                        "--trainer.strategy.config='{zero_optimization: {stage: 2}, gradient_clipping: 1.0}'")
    if options.get("stage") == 3 and any(type(c).__name__ == "EMA" for c in trainer.callbacks):
        problems.append("flowrl.callbacks.EMA with DeepSpeed ZeRO-3: the EMA reads the trained weights, which ZeRO-3 "
                        "keeps partitioned inside its engine; use deepspeed_stage_2, or --trainer.strategy=fsdp2 "
                        "(EMA of each rank's shard)")
    return problems


def _is_policy_gradient(method: Any) -> bool:
    """Whether ``method`` (a class or a built module) trains with PPO's one optimizer (``uses_ppo``, set by
    :class:`~flowrl.methods.PolicyGradient`), read off it: the strategies sit below the methods and import none."""
    return bool(getattr(method, "uses_ppo", False))
