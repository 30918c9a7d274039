"""Start ``python -m flowrl.rewards.serve`` as a real process on a free loopback port, and stop it."""

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
