"""Which failed requests ``RemoteReward`` sends again (``retryable``): timeouts, refused or dropped connections and
the statuses of an overloaded or restarting server; not an answer that would come back the same (400, 404, 500).
Also the doctests of the reward contract (``to_scores``)."""

import doctest
import http.client
import socket
import urllib.error

import pytest

import flowrl.rewards.base
from flowrl.rewards.remote import retryable


def http_error(code):
    return urllib.error.HTTPError("http://127.0.0.1:8000/score", code, "status", {}, None)


@pytest.mark.parametrize("error, again", [
    (TimeoutError("timed out"), True),
    (socket.timeout("timed out"), True),
    (urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")), True),
    (ConnectionResetError(104, "Connection reset by peer"), True),
    (http.client.RemoteDisconnected("Remote end closed connection without response"), True),
    (http.client.IncompleteRead(b"partial"), True),
    (http_error(429), True),
    (http_error(502), True),
    (http_error(503), True),
    (http_error(504), True),
    (http_error(400), False),
    (http_error(404), False),
    (http_error(500), False),
    (http_error(501), False),
    (ValueError("the answer is not JSON"), False),
], ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_retryable(error, again):
    assert retryable(error) is again


def test_reward_contract_doctests():
    result = doctest.testmod(flowrl.rewards.base)
    assert result.attempted > 0 and result.failed == 0
