"""Context parallelism beside FSDP2: the one device mesh, the gradient sum, and what a run with it must satisfy.

:class:`~flowrl.strategies.fsdp2.FSDP2Strategy` with ``context_parallel_size > 1`` builds one mesh,
``("replica", "ring", "ulysses")`` (:func:`context_parallel_mesh`): a group of ``degree`` consecutive processes
splits one clip along the attention's dimension (diffusers' ``ContextParallelConfig`` reads ``ring`` and
``ulysses``; :mod:`flowrl.policies.context_parallel`), and FSDP2 shards every weight over all three flattened
(:func:`sharding_mesh`), each process one shard as without context parallelism.

A weight's gradient on a process of a group is its tokens' share, so the whole gradient is the sum over the group:
FSDP2's reduce-scatter over every process makes it when its divide factor is the number of replicas
(``world / degree``), not the number of processes (:func:`split_for_strategy`).

The loop sees replicas, not processes: the strategy's ``distributed_sampler_kwargs`` (Lightning's data-parallel rank
and world, :func:`replica_rank`) give every process of a group its replica's rows, seeds and validation batches
(``flowrl.data``), and the module's collectives (``flowrl.methods.distributed.Ranks``) count each replica once in
the gathered batch, the metrics and the validation means.
"""

from __future__ import annotations

from typing import Any, Optional

from flowrl.policies.context_parallel import context_parallel_problems, enable_context_parallel


def context_parallel_mesh(device_type: str, world: int, degree: int, attention: str):
    """The one ``DeviceMesh`` of context parallelism and FSDP2 (see the module docstring): ``world / degree``
    replicas of a ``degree``-process group along ``attention``'s dimension (the other of size 1)."""
    from torch.distributed.device_mesh import init_device_mesh

    ring, ulysses = (degree, 1) if attention == "ring" else (1, degree)
    return init_device_mesh(device_type, (world // degree, ring, ulysses),
                            mesh_dim_names=("replica", "ring", "ulysses"))


def sharding_mesh(mesh):
    """The 1-D mesh of every process of ``mesh`` (:func:`context_parallel_mesh`'s), in its order: what FSDP2 splits
    each weight over."""
    return mesh["replica", "ring", "ulysses"]._flatten("shard")


def split_for_strategy(policy: Any, mesh, backend: Optional[str] = None) -> list:
    """Split ``policy``'s loaded, adapted and sharded denoiser over ``mesh``'s context-parallel group, and make
    FSDP2's gradient reduction the sum over the group averaged over the replicas. Returns the split models."""
    from torch.distributed.fsdp import FSDPModule

    models = enable_context_parallel(policy, mesh, backend)
    replicas = mesh["replica"].size()
    for module in policy.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(float(replicas))
            # a sum, then the division: the divide factor otherwise rides NCCL's PREMUL_SUM, which gloo lacks
            module.set_force_sum_reduction_for_comms(True)
    return models


def replica_rank(mesh) -> dict[str, int]:
    """This process's replica and the number of replicas of ``mesh`` (:func:`context_parallel_mesh`'s), as
    Lightning's ``distributed_sampler_kwargs`` name them (``rank``, ``num_replicas``): the processes of one
    context-parallel group share a replica, so they draw one batch."""
    return {"num_replicas": mesh["replica"].size(), "rank": mesh["replica"].get_local_rank()}


def data_parallel_size(strategy: Any, world: int) -> int:
    """Data-parallel replicas of a run of ``world`` processes under ``strategy`` (a built strategy, its config node
    ``{class_path, init_args}`` or a name), known before the process group exists: ``world / context_parallel_size``
    (``world`` where the degree does not divide it, which :func:`context_parallel_run_problems` reports).

    >>> data_parallel_size({"init_args": {"context_parallel_size": 2}}, 8), data_parallel_size("ddp", 8)
    (4, 8)
    """
    if isinstance(strategy, dict):
        degree = (strategy.get("init_args") or {}).get("context_parallel_size", 1)
    else:
        degree = getattr(strategy, "context_parallel_size", 1)
    degree = int(degree or 1)
    return world // degree if degree >= 1 and world % degree == 0 else world


def context_parallel_run_problems(policy: Any, options: dict, world: Optional[int]) -> list[str]:
    """The problems of a trainer run whose FSDP2 strategy has ``options`` (``context_parallel_size``,
    ``context_parallel_attention``) with the built ``policy`` (None: the method could not be built) on ``world``
    processes: the policy's (:func:`~flowrl.policies.context_parallel.context_parallel_problems`; the loop itself
    runs any method on replicas, see the module docstring)."""
    degree, attention = int(options["context_parallel_size"]), options.get("context_parallel_attention", "ulysses")
    return [] if policy is None else context_parallel_problems(policy, degree, attention, world)
