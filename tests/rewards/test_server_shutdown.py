"""SIGINT to the reward server's main process (only to it, not to its process group) shuts everything down as
SIGTERM does (``tests/rewards/server_process.py``'s check): the main process exits with 130, no process of its group
remains, the port can be bound again, and a client of the server that is gone gets a clear error naming the URL.
SIGTERM is checked in the default run on the module server of ``tests/rewards/test_server.py`` (its last test), one
start-up less."""

import signal

import pytest

from tests.rewards.server_process import assert_a_signal_stops_every_process, reward_server

pytest.importorskip("litserve", reason="the reward server needs the `serve` extra")


# slow: both signals reach one handler (rewards/serve.py's _stop_on_signals), and SIGTERM is in the default run; a
# server of its own (the signal stops it), a few seconds of CPU for LitServe's imports and workers
@pytest.mark.slow
def test_sigint_stops_every_server_process_and_frees_the_port(tmp_path):
    (tmp_path / "reward.yaml").write_text("rewards:\n  - class_path: tests.rewards.served.MeanPixel\n")
    with reward_server(str(tmp_path / "reward.yaml"), tmp_path) as (url, proc):
        assert_a_signal_stops_every_process(url, proc, signal.SIGINT)
