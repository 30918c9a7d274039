"""A real process stopped by SIGTERM the way a scheduler stops it: wait for a state it reaches, signal, collect."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable

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
