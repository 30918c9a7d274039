"""What a multi-node run's rank zero waits for, said once before it waits: ``--trainer.num_nodes=2`` with no other
node started blocks in the process-group rendezvous until its timeout (30 minutes by default) without a word."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional


def rendezvous_notice(trainer, environ: Optional[dict] = None) -> Optional[str]:
    """The line rank zero prints before it waits for the other nodes (None: one node).

    >>> from types import SimpleNamespace as NS
    >>> env = NS(main_address="10.0.0.1", main_port=29500)
    >>> trainer = NS(num_nodes=2, num_devices=1, strategy=NS(cluster_environment=env, _timeout=timedelta(minutes=30)))
    >>> rendezvous_notice(trainer, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})[:92]
    'flowrl: rank 0 waits for 2 nodes x 1 process (world size 2) to join at 10.0.0.1:29500 (MASTE'
    """
    nodes = getattr(trainer, "num_nodes", 1)
    if nodes <= 1:
        return None
    environ = os.environ if environ is None else environ
    strategy, per_node = trainer.strategy, trainer.num_devices
    cluster = getattr(strategy, "cluster_environment", None)
    where = f"{cluster.main_address}:{cluster.main_port}" if cluster is not None else "MASTER_ADDR:MASTER_PORT"
    timeout = getattr(strategy, "_timeout", None) or timedelta(minutes=30)
    unset = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(name)]
    line = (f"flowrl: rank 0 waits for {nodes} nodes x {per_node} process{'es' if per_node > 1 else ''} (world size "
            f"{nodes * per_node}) to join at {where} (MASTER_ADDR:MASTER_PORT); start the same command on every other "
            f"node with NODE_RANK={'1' if nodes == 2 else f'1..{nodes - 1}'} and the same MASTER_ADDR and "
            f"MASTER_PORT. It gives up after "
            f"{timeout} (trainer.strategy's timeout).")
    if unset:
        line += f" {' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set here: set them on every node."
    return line
