"""SIGTERM or SIGINT to the reward server's main process (only to it, not to its process group) shuts everything
down: the main process exits with 128 + the signal number, no process of its group remains (no orphaned worker or
queue manager holding the port), and the port can be bound again; a client of the server that is gone gets a clear
error naming the URL (the same server: one start-up less)."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from flowrl.rewards import RemoteReward
from flowrl.rewards.remote import RemoteRewardError
from tests.rewards.server_process import reward_server
from tests.rewards.test_server import images

pytest.importorskip("litserve", reason="the reward server needs the `serve` extra")

HANG_GUARD = 90  # seconds; only so that a regression fails instead of hanging the suite


def group_members(pgid: int) -> list[str]:
    """``pid state command`` of every process in the group, from /proc (for failure messages)."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
            if entry.name.isdigit() and int(fields[2]) == pgid:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                members.append(f"{entry.name} {fields[0]} {command[:120]}")
        except (OSError, ValueError, IndexError):
            continue
    return members


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


# SIGINT in the slow run: both signals reach one handler (rewards/serve.py's _stop_on_signals); each test starts a
# server of its own (the signal stops it), a few seconds of CPU for LitServe's imports and workers
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_server_process_and_frees_the_port(sig, tmp_path):
    (tmp_path / "reward.yaml").write_text("rewards:\n  - class_path: tests.rewards.served.MeanPixel\n")
    with reward_server(str(tmp_path / "reward.yaml"), tmp_path) as (url, proc):
        port, pgid = int(url.rsplit(":", 1)[1]), os.getpgid(proc.pid)
        remote = RemoteReward(url, retries=2, backoff=0.05, timeout=5)
        try:
            remote.setup(None, None, "fit")  # the health check passes
            assert remote.score(images(1, 3), ["p"]).shape == (1,)
            assert len(group_members(pgid)) > 1  # the main process and its workers / manager / API server
            os.kill(proc.pid, sig)  # the main process only, as `kill <pid>` or a process manager does
            try:
                status = proc.wait(timeout=HANG_GUARD)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the server did not exit on {sig.name}; its group: {group_members(pgid)}")
            deadline = time.monotonic() + HANG_GUARD
            while not group_is_gone(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert group_is_gone(pgid), f"processes left after {sig.name}: {group_members(pgid)}"
            with socket.socket() as s:  # nothing listens on the port any more (SO_REUSEADDR: as a restarted server)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen()
            assert status == 128 + sig  # documented in flowrl.rewards.serve: 143 for SIGTERM, 130 for SIGINT
            with pytest.raises(RemoteRewardError, match=rf"{url}/score did not answer after 3 attempts"):
                remote.score(images(1, 3), ["p"])
            with pytest.raises(RemoteRewardError, match=rf"{url}/health"):
                remote.setup(None, None, "fit")
        finally:  # a failure must not leave the group behind (reward_server only kills it while the main lives)
            if not group_is_gone(pgid):
                os.killpg(pgid, signal.SIGKILL)
