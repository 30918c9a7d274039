"""Strategy specifics: FSDP2 as the one-word strategy ``fsdp2`` (:mod:`~flowrl.strategies.fsdp2`; it saves callback
state per rank in sharded checkpoints, :mod:`~flowrl.checkpoints.sharded`), DeepSpeed's accumulation and checked
step (:mod:`~flowrl.strategies.deepspeed`), and the checks of ``trainer.strategy`` against a config before any weight
loads (:mod:`~flowrl.strategies.checks`). Multi-GPU and multi-node runs come from Lightning's strategies; these modules
only adapt them to a loop with manual optimization, named adapters and sharded callback state.
"""

from flowrl.strategies.fsdp2 import (FSDP2Strategy, forward_is_collective, is_fsdp2, load_for_strategy,
                                    shard_for_strategy)

__all__ = ["FSDP2Strategy", "forward_is_collective", "is_fsdp2", "load_for_strategy", "shard_for_strategy"]
