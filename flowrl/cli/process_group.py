"""The process group ends before the interpreter does.

Lightning's strategies create the ``torch.distributed`` process group and leave it for the interpreter to tear down.
With gloo that is a race: its worker threads can still hold work (and tensors) when Python finalizes, and the
process dies with ``terminate called without an active exception`` (SIGABRT, exit -6) after a run that finished
well, most often on the rank whose peer has already gone (pytorch/pytorch#179291). An exit handler destroys it while
the interpreter is still alive. At exit, not when a command returns: several fits in one process share one group
(``tests/methods/fits_in_one_process.py``).
"""

from __future__ import annotations

import atexit

import torch

_registered = False


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


def end_process_group_at_exit() -> None:
    """Have :func:`end_process_group` run at interpreter exit (once, however often this is called)."""
    global _registered
    if not _registered:
        atexit.register(end_process_group)
        _registered = True
