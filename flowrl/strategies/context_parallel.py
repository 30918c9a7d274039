"""Context parallelism beside FSDP2: the one device mesh, the gradient sum, and what a run with it must satisfy.

:class:`~flowrl.strategies.fsdp2.FSDP2Strategy` with ``context_parallel_size > 1`` builds one mesh,
``("replica", "ring", "ulysses")`` (:func:`context_parallel_mesh`): a group of ``degree`` consecutive processes
splits one clip along the attention's dimension (diffusers' ``ContextParallelConfig`` reads ``ring`` and
``ulysses``; :mod:`flowrl.policies.context_parallel`), and FSDP2 shards every weight over all three flattened
(:func:`sharding_mesh`), each process one shard as without context parallelism.

A weight's gradient on a process of a group is its tokens' share, so the whole gradient is the sum over the group:
FSDP2's reduce-scatter over every process makes it when its divide factor is the number of replicas
(``world / degree``), not the number of processes (:func:`split_for_strategy`).
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


def context_parallel_run_problems(policy: Any, options: dict, world: Optional[int]) -> list[str]:
    """The problems of a trainer run whose FSDP2 strategy has ``options`` (``context_parallel_size``,
    ``context_parallel_attention``) with the built ``policy`` (None: the method could not be built) on ``world``
    processes: the policy's (:func:`~flowrl.policies.context_parallel.context_parallel_problems`), and the loop's.

    The loop hands every process its own rows (``flowrl.data``, the gathers of ``flowrl.methods.distributed``);
    the processes of a context-parallel group must instead share one batch and count once in the gathered one, which
    the loop does not do yet: a run is refused rather than trained on duplicated rows.
    """
    degree, attention = int(options["context_parallel_size"]), options.get("context_parallel_attention", "ulysses")
    problems = [] if policy is None else context_parallel_problems(policy, degree, attention, world)
    return problems + [f"trainer.strategy.context_parallel_size={degree}: flowrl's training loop does not yet give "
                       "the processes of a context-parallel group one batch (each process draws its own rows); "
                       "use context_parallel_size: 1 for fit / validate / predict. The split denoiser itself is "
                       "ready (flowrl.strategies.context_parallel.split_for_strategy, docs/scaling-out.md)"]
