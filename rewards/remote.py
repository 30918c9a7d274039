"""``RemoteReward``: a reward callback that scores over HTTP on a reward server (``python -m flowrl.rewards.serve``).

Requests time out after ``timeout`` seconds. Failures that may pass (a timeout, a refused or dropped connection,
HTTP 429, 502, 503 or 504) are retried ``retries`` times, waiting ``backoff * 2**i`` seconds before retry ``i``; after
the last one the error names the URL. Any other answer (400 for a malformed request or one the reward cannot score,
404, 500 for a fault of the server or its reward...) fails at once with the server's status and message: sending the
same request again would get the same answer. With ``overlap`` (the default), ``submit`` sends a
sampling chunk's images from a background thread and returns at once, so the loop samples the next chunk while
this one is scored (set the method's ``sample_chunk_size`` to get several chunks per rollout). Only the standard
library is used on the client side.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional
from urllib.parse import urlparse

import torch
from torch import Tensor

from flowrl.rewards.base import RewardCallback
from flowrl.rewards.protocol import ENCODINGS, decode_scores, encode_images, encode_metadata
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


def backoff_delays(retries: int, backoff: float) -> list[float]:
    """Seconds to wait before each retry: ``backoff * 2**i`` for ``i < retries``.

    >>> backoff_delays(3, 0.5)
    [0.5, 1.0, 2.0]
    """
    return [backoff * 2 ** i for i in range(retries)]


RETRY_STATUSES = (429, 502, 503, 504)  # too many requests, bad gateway, unavailable, gateway timeout


def retryable(error: BaseException) -> bool:
    """Whether a failed request may succeed if sent again: timeouts, refused or dropped connections, and the HTTP
    statuses of an overloaded or restarting server (:data:`RETRY_STATUSES`); not other HTTP errors (400, 404, 500...)
    nor anything else.

    >>> import urllib.error
    >>> retryable(urllib.error.HTTPError("http://h/score", 503, "Service Unavailable", {}, None))
    True
    >>> retryable(urllib.error.HTTPError("http://h/score", 500, "Internal Server Error", {}, None))
    False
    >>> retryable(urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")))
    True
    >>> retryable(TimeoutError("timed out")), retryable(ValueError("not JSON"))
    (True, False)
    """
    if isinstance(error, urllib.error.HTTPError):  # an answer, so before URLError (its base class)
        return error.code in RETRY_STATUSES
    # OSError: URLError (refused, unreachable, DNS), TimeoutError, ConnectionError (reset); http.client: the
    # connection dropped mid-answer (RemoteDisconnected, IncompleteRead)
    return isinstance(error, (OSError, http.client.HTTPException))


def _server_message(error: urllib.error.HTTPError) -> str:
    """The ``detail`` of a JSON error answer (FastAPI's form), else the body's start."""
    try:
        text = error.read().decode(errors="replace")
    except OSError:
        return error.reason or ""
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail is not None else text[:500]


class RemoteRewardError(RuntimeError):
    """The reward server could not score a request (after every retry, or a request it rejected)."""


class RemoteReward(RewardCallback):
    """Scores on a reward server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000`` (requests go to ``<url>/score``).
        reward: which of the server's rewards to use; None: the server must serve exactly one.
        timeout: seconds per request. retries: further attempts after a failure that may pass (timeouts, refused
            or dropped connections, HTTP 429/502/503/504; see :func:`retryable`). backoff: seconds before the first
            retry, doubling each time.
        overlap: score submitted chunks in a background thread (``max_workers`` requests in flight).
        encoding: ``png`` (8-bit, small) or ``array`` (exact float32).
        clips: send a video's whole clips ``[B, F, 3, H, W]`` for the server's reward to read (a video judge such as
            VideoReward or VideoScore2 must get them); false (the default): send the frames ``frames`` picks, as
            images, and reduce their scores here.
        weight, name, batch_size, frames, frame_reduction: as every reward (``name`` defaults to ``reward``, else
            ``remote``).
    """

    default_name = "remote"

    def __init__(self, url: str, reward: Optional[str] = None, weight: float = 1.0, name: Optional[str] = None,
                 batch_size: int = 64, timeout: float = 60.0, retries: int = 3, backoff: float = 0.5,
                 overlap: bool = True, encoding: str = "png", max_workers: int = 2, clips: bool = False,
                 frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        super().__init__(weight, name or reward, batch_size, frames, frame_reduction)
        parsed = urlparse(url)
        problems = []
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            problems.append(f"url={url!r} must look like http://host:port")
        if timeout <= 0 or retries < 0 or backoff < 0 or max_workers < 1:
            problems.append(f"timeout={timeout} must be > 0, retries={retries} and backoff={backoff} >= 0, "
                            f"max_workers={max_workers} >= 1")
        if encoding not in ENCODINGS:
            problems.append(f"encoding={encoding!r}; choose one of {ENCODINGS}")
        if problems:
            raise ValueError(f"RemoteReward {self.name!r}: " + "; ".join(problems))
        self.url, self.reward = url.rstrip("/"), reward
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.overlap, self.encoding, self.max_workers, self.clips = overlap, encoding, max_workers, clips
        self._pool: Optional[ThreadPoolExecutor] = None

    @property
    def takes_clips(self) -> bool:
        """With ``clips``, ``_score`` gets whole clips and sends them (the server's reward picks its frames)."""
        return self.clips

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None}  # a thread pool does not pickle (checkpoints, spawned workers)

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Fail before training if the server does not answer its health check."""
        self._request("GET", "/health", None)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def submit(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> Future:
        if not self.overlap:
            return super().submit(images, prompts, metadata)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix=f"reward-{self.name}")
        device = images.device
        images = images.detach().cpu()  # the copy happens now: the caller may reuse the device buffer
        metadata = {k: v.cpu() if torch.is_tensor(v) else v for k, v in (metadata or {}).items()}
        return self._pool.submit(lambda: self.score(images, list(prompts), metadata).to(device))

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        body = {"images": encode_images(images, self.encoding), "prompts": list(prompts),
                "metadata": encode_metadata(metadata)}
        if self.reward is not None:
            body["rewards"] = [self.reward]
        scores = decode_scores(self._request("POST", "/score", body)["scores"])
        key = self.reward or (next(iter(scores)) if len(scores) == 1 else None)
        if key not in scores or scores[key].shape != (len(prompts),):
            raise RemoteRewardError(f"reward server {self.url} returned {sorted(scores)} for {len(prompts)} images; "
                                    "set `reward:` to one of those names (it must serve exactly one otherwise)")
        return scores[key]

    def _request(self, method: str, path: str, body: Optional[dict]) -> Any:
        """The decoded JSON answer (or text), retrying the failures that :func:`retryable` accepts."""
        url, data = self.url + path, None if body is None else json.dumps(body).encode()
        delays, last = backoff_delays(self.retries, self.backoff), None
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(url, data=data, method=method,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    text = response.read().decode()
                return json.loads(text) if text[:1] in "{[" else text
            except Exception as err:  # noqa: BLE001 - sorted by `retryable`; the rest is re-raised below
                if not retryable(err):
                    if isinstance(err, urllib.error.HTTPError):
                        verb = "rejected the request" if err.code < 500 else "failed on the request"
                        raise RemoteRewardError(f"reward server {url} {verb} ({err.code}): "
                                                f"{_server_message(err)}") from err
                    raise
                if isinstance(err, urllib.error.HTTPError):
                    last = f"HTTP {err.code} {err.reason}: {_server_message(err)}"
                else:
                    last = repr(err)
            if attempt < self.retries:
                time.sleep(delays[attempt])
        raise RemoteRewardError(f"reward server {url} did not answer after {self.retries + 1} attempts "
                                f"(timeout {self.timeout}s each, backoff {self.backoff}s doubling): {last}")
