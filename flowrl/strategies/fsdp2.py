"""FSDP2 as a one-word Lightning strategy: ``--trainer.strategy=fsdp2``.

:class:`FSDP2Strategy` is Lightning's ``ModelParallelStrategy`` with every process one data-parallel rank (no tensor
parallelism), so the weights the policy's plan (:mod:`flowrl.policies.sharding`) hands to ``fully_shard`` are split
over all processes of all nodes. Unlike Lightning's ``fsdp`` (FSDP1), it runs on a CPU accelerator too (gloo), which
is how the tests check it. What it adds to ``ModelParallelStrategy``:

- ``block_backward_sync`` (the loop's ``no_sync``) turns off FSDP2's gradient reduce-scatter
  (``set_requires_gradient_sync``) for the non-final micro-batches of a minibatch, as DDP's ``no_sync`` does;
- callbacks whose state holds sharded tensors (the EMA of sharded weights) save and resume them per rank
  (:mod:`flowrl.checkpoints.sharded`) instead of rank zero's shard only;
- importing :mod:`flowrl.strategies` (as :mod:`flowrl.methods` does) registers the name ``fsdp2`` in Lightning's
  ``StrategyRegistry``.

Under FSDP2 every forward of the denoiser is a collective (its blocks are all-gathered), so every rank must run the
same number of them: the PPO update pads a rank's micro-batches to the most any rank has (weight 0), and the checks
before loading require equal validation batch counts (:mod:`flowrl.strategies.checks`).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

from flowrl.checkpoints.atomic import commit, link, partial_path, remove_path, save_failed
from flowrl.checkpoints.sharded import (META, SHARDED_KEY, fill_sharded, is_sharded_checkpoint, shard_templates,
                                        split_sharded)
from flowrl.policies.sharding import shard_policy
from flowrl.strategies.context_parallel import context_parallel_mesh, replica_rank, sharding_mesh, split_for_strategy
from flowrl.strategies.sharded_load import load_into_shards

NAME = "fsdp2"


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over every process (``tensor_parallel_size=1``); see the module docstring.

    Args:
        reshard_after_forward: free each block's gathered weights after its forward (False: keep them until the
            backward, less communication and more memory).
        reduce_every_micro_batch: reduce-scatter the gradients after every micro-batch instead of accumulating them
            unsharded until the minibatch's last one. Accumulating (the default) communicates once per optimizer
            step, but each rank holds the whole gradient of the trained weights meanwhile: nothing for LoRA, the
            model's size in float32 for full fine-tuning, where this option keeps gradients at 1/N per rank.
        save_distributed_checkpoint: each rank writes its shards into a checkpoint folder (False: rank zero writes
            one file with every weight gathered).
        context_parallel_size: processes that split one clip's tokens (diffusers' context parallelism,
            :mod:`flowrl.strategies.context_parallel`); 1: none. The weights stay sharded over every process.
        context_parallel_attention: ``ulysses`` (all-to-all; CPU or GPU) or ``ring`` (GPU attention backends only).
        attention_backend: diffusers' attention backend of the split denoiser (None: its own, ``native``; ring
            attention needs e.g. ``_native_cudnn`` or ``flash``).
        data_parallel_size, tensor_parallel_size, process_group_backend, timeout: ``ModelParallelStrategy``'s;
            ``data_parallel_size="auto"`` is every process.
    """

    def __init__(self, reshard_after_forward: bool = True, reduce_every_micro_batch: bool = False,
                 save_distributed_checkpoint: bool = True, data_parallel_size: Any = "auto",
                 tensor_parallel_size: int = 1, process_group_backend: Optional[str] = None,
                 context_parallel_size: int = 1, context_parallel_attention: str = "ulysses",
                 attention_backend: Optional[str] = None, **kwargs: Any):
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, **kwargs)
        self.reshard_after_forward, self.reduce_every_micro_batch = reshard_after_forward, reduce_every_micro_batch
        self.context_parallel_size, self.context_parallel_attention = context_parallel_size, context_parallel_attention
        self.attention_backend = attention_backend
        self.context_parallel_mesh = None  # built with the process group (setup_environment)

    def setup_environment(self) -> None:
        # ModelParallelStrategy's "auto" is one data-parallel rank per node (tensor parallelism within a node);
        # flowrl applies no tensor parallelism, so every process is a data-parallel rank
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes // self._tensor_parallel_size
        super().setup_environment()
        if self.context_parallel_size > 1:
            self.context_parallel_mesh = context_parallel_mesh(self.root_device.type, self.world_size,
                                                               self.context_parallel_size,
                                                               self.context_parallel_attention)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """The data-parallel ranks, as Lightning's samplers read them: with context parallelism the replicas
        (:func:`~flowrl.strategies.context_parallel.replica_rank`: every process of a group draws its replica's
        rows), else every process."""
        if self.context_parallel_mesh is not None:
            return replica_rank(self.context_parallel_mesh)
        return super().distributed_sampler_kwargs

    def _fsdp_modules(self) -> list:
        from torch.distributed.fsdp import FSDPModule

        return [m for m in self.model.modules() if isinstance(m, FSDPModule)] if self.model is not None else []

    @contextmanager
    def block_backward_sync(self):
        """No gradient reduce-scatter in the backward passes inside (gradients accumulate unsharded); the next
        backward outside reduces everything accumulated, as DDP's ``no_sync``."""
        modules = [] if self.reduce_every_micro_batch else self._fsdp_modules()
        for m in modules:
            m.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for m in modules:
                m.set_requires_gradient_sync(True, recurse=False)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        callbacks, sharded = split_sharded(checkpoint.get("callbacks", {}))
        if not self._save_distributed_checkpoint:  # one file: gather the callbacks' tensors whole too (every rank)
            if sharded:
                checkpoint["callbacks"] = fill_sharded(callbacks, {k: v.full_tensor() for k, v in sharded.items()})
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        from torch.distributed.checkpoint import save

        path = Path(self.broadcast(str(filepath)))
        files = getattr(self.checkpoint_io, "files", None)  # the atomic checkpoint IO's record (rank zero's)
        step = int(checkpoint.get("global_step", -1))
        newest = files.links_instead(path, step) if files is not None and self.global_rank == 0 else None
        if self.broadcast(newest is not None):  # `last` at the step just saved: a link to it, not a second copy
            if self.global_rank == 0:
                link(newest, path)
            return self.barrier()
        # ModelParallelStrategy's distributed save, with the callbacks' shards as one more top-level entry, written
        # whole beside the target and then put in its place (checkpoints.atomic): a killed save leaves the old one
        partial = partial_path(path)
        if self.global_rank == 0:
            remove_path(partial)
            partial.mkdir(parents=True)
        self.barrier()
        state = {"state_dict": checkpoint.pop("state_dict"), **({SHARDED_KEY: sharded} if sharded else {}),
                 **{f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))}}
        checkpoint["callbacks"] = callbacks
        failed: Optional[Exception] = None
        try:
            save(state, checkpoint_id=partial)
            if self.global_rank == 0:
                torch.save(checkpoint, partial / META)
        except Exception as err:  # a full disk on any rank: every rank raises, after the partial folder is removed
            failed = err
        if self.reduce_boolean_decision(failed is not None, all=False):  # also every rank's shards are written
            if self.global_rank == 0:
                remove_path(partial)
            self.barrier()
            raise save_failed(path, failed) from failed
        if self.global_rank == 0:
            commit(partial, path)
            if files is not None:
                files.saved(path, step)
        self.barrier()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_file():  # one file, e.g. from a 1-process run
            return self._load_full_checkpoint(path, weights_only)
        metadata = super().load_checkpoint(checkpoint_path, weights_only)
        templates = shard_templates(metadata.get("callbacks", {}), data_parallel_mesh(self))
        if templates and is_sharded_checkpoint(path):
            from torch.distributed.checkpoint import load

            state = {SHARDED_KEY: templates}
            load(state, checkpoint_id=path)
            metadata["callbacks"] = fill_sharded(metadata["callbacks"], state[SHARDED_KEY])
        return metadata

    def _load_full_checkpoint(self, path: Path, weights_only: Optional[bool]) -> dict[str, Any]:
        """A one-file checkpoint (a 1-process or DDP run's, or ``save_distributed_checkpoint=False``) into the sharded
        model and optimizers. Lightning's own loader names a plain optimizer's states by position among *all* the
        module's parameters (FSDP1's ``rekey_optim_state_dict``), but the optimizer holds only the trained ones, so
        a LoRA run's states landed on frozen weights and the load failed with ``Missing optimizer state``; here they
        are named by position in the optimizer itself."""
        from lightning.fabric.strategies.model_parallel import _load_raw_module_state
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        strict = self.lightning_module.strict_loading
        _load_raw_module_state(checkpoint.pop("state_dict"), self.model, strict=strict)
        names = {param: name for name, param in self.model.named_parameters()}
        options = StateDictOptions(broadcast_from_rank0=True, full_state_dict=True, strict=strict)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=named_optimizer_state(state, optimizer,
                                                                                                  names),
                                     options=options)
        return checkpoint


def named_optimizer_state(state: dict, optimizer, names: dict) -> dict:
    """A ``torch.optim`` state dict keyed by parameter position (``state`` and ``param_groups[i]["params"]``) keyed by
    each parameter's name instead, the positions read from ``optimizer`` (the one that wrote it, rebuilt)."""
    order = [names[p] for group in optimizer.param_groups for p in group["params"]]
    if len(order) != sum(len(g["params"]) for g in state["param_groups"]):
        raise ValueError(f"the checkpoint's optimizer holds {sum(len(g['params']) for g in state['param_groups'])} "
                         f"parameters and this run's {len(order)}: it was written by a run that trains other weights")
    return {"state": {order[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]}


def is_fsdp2(strategy) -> bool:
    """Whether the strategy shards the policy with FSDP2 (``fsdp2`` or any ``ModelParallelStrategy``): its weights and
    gradients are DTensor shards, gradients reduced inside the backward."""
    return isinstance(strategy, ModelParallelStrategy)


def forward_is_collective(strategy) -> bool:
    """Whether each forward of the denoiser all-gathers weights from every rank (FSDP2 or DeepSpeed ZeRO-3 on
    several processes), so every rank must run as many as the others."""
    sharded = is_fsdp2(strategy) or getattr(strategy, "zero_stage_3", False)
    return bool(sharded) and strategy.world_size > 1


def shard_for_strategy(strategy, policy) -> list[str]:
    """Apply the policy's sharding plan when the strategy is FSDP2 (``ModelParallelStrategy``); other strategies
    keep the model as it is. Returns the sharded modules' names.

    Raises:
        ValueError: a ``ModelParallelStrategy`` with tensor parallelism, which flowrl does not apply.
    """
    mesh = data_parallel_mesh(strategy)
    if mesh is None:
        return []
    return shard_policy(policy, mesh, getattr(strategy, "reshard_after_forward", True))


def load_for_strategy(strategy, module) -> list[str]:
    """Load ``module``'s weights (``module.load_weights()``) under ``strategy`` and shard them when it is FSDP2;
    returns the sharded modules' names. On several FSDP2 processes every rank builds the trained denoiser on the meta
    device and reads only its own slices of the weights (:mod:`flowrl.strategies.sharded_load`); under any other
    strategy, or one process, every rank loads the whole model as a script does.

    Raises:
        ValueError: a ``ModelParallelStrategy`` with tensor parallelism (before any weight loads).
    """
    mesh = data_parallel_mesh(strategy)
    if mesh is None or mesh.size() == 1 or module.weights_loaded:
        module.load_weights()
        sharded = shard_for_strategy(strategy, module.policy)
    else:
        sharded = load_into_shards(module.policy, module.load_weights, mesh,
                                   getattr(strategy, "reshard_after_forward", True))
    if getattr(strategy, "context_parallel_mesh", None) is not None:  # on the loaded, adapted and sharded models
        split_for_strategy(module.policy, strategy.context_parallel_mesh, strategy.attention_backend)
    return sharded


def data_parallel_mesh(strategy):
    """The 1-D ``DeviceMesh`` FSDP2 shards over (every process; with context parallelism, the context-parallel
    mesh flattened, so that both read one mesh), None when the strategy is not FSDP2.

    Raises:
        ValueError: a ``ModelParallelStrategy`` with tensor parallelism, which flowrl does not apply.
    """
    if not is_fsdp2(strategy):
        return None
    mesh = strategy.device_mesh
    if mesh["tensor_parallel"].size() > 1:
        raise ValueError(f"ModelParallelStrategy with tensor_parallel_size={mesh['tensor_parallel'].size()}: flowrl "
                         "shards with FSDP2 over data-parallel ranks only; use --trainer.strategy=fsdp2")
    if getattr(strategy, "context_parallel_mesh", None) is not None:
        return sharding_mesh(strategy.context_parallel_mesh)
    return mesh["data_parallel"]


def register() -> None:
    if NAME not in StrategyRegistry:
        StrategyRegistry.register(NAME, FSDP2Strategy,
                                  description="FSDP2 (fully_shard) over every process, on CPU or GPU (flowrl)")


register()
