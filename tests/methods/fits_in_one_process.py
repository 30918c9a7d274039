"""Several ``python -m flowrl fit`` commands run one after another in one process:
``python -m tests.methods.fits_in_one_process RUNS.json``, where RUNS.json holds a list of argument lists.

Under ``--trainer.devices=2`` the first fit starts the second rank (Lightning re-runs this same command with
``LOCAL_RANK=1``), which runs the same list; every later fit finds the process group the first one made and joins it,
so N 2-process fits pay for one start-up and one rendezvous instead of N. A fit that raises ends the process with
status 1 at once (its peer, left waiting in a collective, is killed by the caller's timeout). ``run_in_one_process``
runs such a list from a test."""

import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_in_one_process(runs: list[list[str]], folder: Path, timeout: int = 900) -> str:
    """``runs`` (argument lists of ``python -m flowrl``) one after another in one process (two, when they ask for 2
    devices: one process group for all of them), in a process group of the OS of its own that is killed whole when it
    returns; fails with the output's tail unless every run ended well within ``timeout`` seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runs.json").write_text(json.dumps(runs))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.methods.fits_in_one_process", str(folder / "runs.json")],
                            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = f"(no end within {timeout} s: a rank left waiting?)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, output[-4000:]
    return output


def run_all(runs: list[list[str]]) -> None:
    from flowrl.cli import main

    for args in runs:
        try:
            main(args)
        except BaseException:  # noqa: BLE001  SystemExit of a CLI error included: the peer must not wait
            traceback.print_exc()
            print(f"fits_in_one_process: this fit failed: {' '.join(args)}", file=sys.stderr, flush=True)
            os._exit(1)


if __name__ == "__main__":
    run_all(json.loads(Path(sys.argv[1]).read_text()))
