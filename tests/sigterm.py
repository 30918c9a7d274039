"""A process stopped by SIGTERM the way a scheduler stops it: wait for a state it reaches, signal, collect; a launched
one, or pytest's own (a command run in it, signalled from a thread at a moment the command does not choose)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = 300) -> None:
    """Polls ``ready()`` until it holds; fails naming ``what`` (or with the output of a process that ended first)."""
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready(), proc.communicate()[0][-3000:] if proc.poll() is not None else what


def terminate(proc: subprocess.Popen, what: str = "the run", within: float = 120) -> str:
    """Sends SIGTERM and returns the process's output; fails if it does not stop ``within`` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=within)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{what} did not stop within {within:g} s of SIGTERM")


@contextmanager
def sigterm_when(ready: Callable[[], bool], timeout: float = 300) -> Iterator[None]:
    """Within it, a thread polls ``ready()`` and sends this process SIGTERM once it holds (the handler runs in the
    main thread, where the command runs); fails if ``ready()`` never held while the block ran."""
    done, sent = threading.Event(), []

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < deadline:
            if ready():
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    assert sent, "the state to signal at was never reached"
