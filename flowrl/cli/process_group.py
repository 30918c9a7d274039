"""The process group ends with the command, before the interpreter does.

Lightning's strategies create the ``torch.distributed`` process group and leave it for the interpreter to tear down.
With gloo that is a race: its worker threads can still hold work (and tensors) when Python finalizes, and the
process dies with ``terminate called without an active exception`` (SIGABRT, exit -6) after a run that finished
well, most often on the rank whose peer has already gone (pytorch/pytorch#179291). Destroying it while the
interpreter is alive joins those threads first.
"""

from __future__ import annotations

import torch


def end_process_group() -> bool:
    """Destroy this process's default process group if one is up; whether there was one.

    >>> end_process_group()  # none in a plain process: nothing to do
    False
    """
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return False
    distributed.destroy_process_group()
    return True
