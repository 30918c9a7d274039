"""Start ``python -m flowrl.rewards.serve`` as a real process on a free loopback port, and stop it (with a signal, as
a process manager does, checking that nothing of it remains)."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill(proc: subprocess.Popen) -> None:
    """Stop the server and its workers (its own process group, started by us)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextmanager
def reward_server(config: str, workdir: Path):
    """Yield ``(url, process)`` once ``/health`` answers."""
    port = free_port()
    log = open(workdir / f"server_{port}.log", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowrl.rewards.serve", "--config", config, "--host", "127.0.0.1",
                             "--port", str(port), "--accelerator", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                            env=env, cwd=workdir, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"reward server exited: {(workdir / f'server_{port}.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("reward server did not become healthy in 180 s")
            time.sleep(0.2)
        yield url, proc
    finally:
        kill(proc)
        log.close()


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


def assert_a_signal_stops_every_process(url: str, proc: subprocess.Popen, sig: int, reward: str = None) -> None:
    """Send ``sig`` to the server's main process only (as `kill <pid>` does), after a client of it scored (``reward``
    of its rewards): the main process exits with 128 + the signal number, no process of its group remains (no
    orphaned worker or queue manager holding the port), the port can be bound again, and the client, its server
    gone, gets a clear error naming the URL."""
    import pytest
    import torch

    from flowrl.rewards import RemoteReward
    from flowrl.rewards.remote import RemoteRewardError

    port, pgid = int(url.rsplit(":", 1)[1]), os.getpgid(proc.pid)
    remote = RemoteReward(url, reward=reward, retries=2, backoff=0.05, timeout=5)
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    try:
        remote.setup(None, None, "fit")  # the health check passes
        assert remote.score(image, ["p"]).shape == (1,)
        assert len(group_members(pgid)) > 1  # the main process and its workers / manager / API server
        os.kill(proc.pid, sig)
        try:
            status = proc.wait(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not exit on {signal.Signals(sig).name}; its group: {group_members(pgid)}")
        deadline = time.monotonic() + HANG_GUARD
        while not group_is_gone(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group_is_gone(pgid), f"processes left after {signal.Signals(sig).name}: {group_members(pgid)}"
        with socket.socket() as s:  # nothing listens on the port any more (SO_REUSEADDR: as a restarted server)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
        assert status == 128 + sig  # documented in flowrl.rewards.serve: 143 for SIGTERM, 130 for SIGINT
        with pytest.raises(RemoteRewardError, match=rf"{url}/score did not answer after 3 attempts"):
            remote.score(image, ["p"])
        with pytest.raises(RemoteRewardError, match=rf"{url}/health"):
            remote.setup(None, None, "fit")
    finally:  # a failure must not leave the group behind (reward_server only kills it while the main lives)
        if not group_is_gone(pgid):
            os.killpg(pgid, signal.SIGKILL)
