"""The reward server: any reward callbacks behind HTTP, with batching of concurrent requests.

``python -m flowrl.rewards.serve --config reward.yaml --host 127.0.0.1 --port 8000``, where ``reward.yaml`` lists
reward callbacks as in a training config:

    rewards:
      - class_path: flowrl.rewards.JpegIncompressibility
      - class_path: flowrl.rewards.DigitAlignment
        init_args: {batch_size: 64}
    max_batch_size: 16     # requests scored together
    batch_timeout: 0.01    # seconds the server waits to fill a batch

Endpoints: ``POST /score`` (format: :mod:`flowrl.rewards.protocol`) and ``GET /health`` (200 ``ok`` once every
reward is loaded). Built on Lightning's LitServe (the ``serve`` extra), which queues concurrent requests and hands
them to ``predict`` together; a batch's images are scored in one call per reward (split by image size). Clips
``[B, F, 3, H, W]`` travel whole (:mod:`flowrl.rewards.protocol`) and are scored like a training batch's: a video
judge (``takes_clips``) reads the clips, an image reward its picked frames.

Errors are answered per request, never for a whole batch: 400 ``{"detail": ...}`` naming the field and the fix for
a malformed request (not JSON, wrong types, no images, images that do not decode, unknown rewards), 400 naming the
reward and its message when a reward rejects the request's input (``ValueError`` / ``TypeError``, e.g. a prompt it
cannot parse or an image size its model cannot take), 500 naming the reward when it fails otherwise. Requests
batched with a failing one are scored and answered as usual.

SIGTERM or SIGINT (Ctrl-C) shuts the server down: LitServe's graceful shutdown stops the API server, the inference
workers and the queue manager, the port is released, and the process exits with status ``128 + signal number``
(143 for SIGTERM, 130 for SIGINT), as a shell reports a process stopped by that signal.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from typing import Any, Optional

import torch
from jsonargparse import ActionConfigFile, ArgumentParser

from flowrl.rewards.base import ModelReward, RewardCallback, RewardOutputError
from flowrl.rewards.protocol import decode_score_request, encode_scores, json_type_name

try:
    import litserve
except ImportError:  # the server is optional; the parser below still documents it
    litserve = None

_API_BASE = litserve.LitAPI if litserve is not None else object

INPUT_ERRORS = (ValueError, TypeError)  # raised by a reward on its own input: the request's fault (400)


def failure(reward: RewardCallback, err: Exception) -> tuple[int, str]:
    """``(status, message)`` for a request that ``reward`` failed to score on its own: 400 when the reward rejected
    the input (``ValueError`` / ``TypeError``), 500 when the reward or the server is at fault (anything else, and a
    reward returning something that is not scores)."""
    status = 400 if isinstance(err, INPUT_ERRORS) and not isinstance(err, RewardOutputError) else 500
    what = "cannot score this request" if status == 400 else "failed"
    return status, f"reward {reward.name!r} {what}: {type(err).__name__}: {err}"


class RewardAPI(_API_BASE):
    """LitServe API that scores requests with ``rewards`` (each request may pick a subset by name).

    Requests are isolated within a batch: LitServe answers every request of a batch with the error when
    ``decode_request``, ``predict`` or ``encode_response`` raises, so none of them raises for one request. A
    malformed request is marked in ``decode_request`` and skipped; a batch whose ``score`` call raises is scored
    again request by request; and ``encode_response`` turns a failed request's ``(status, message)`` into its own
    ``JSONResponse`` (``{"detail": message}``), which LitServe hands back as that request's answer.
    """

    def __init__(self, rewards: list[RewardCallback], max_batch_size: int = 16, batch_timeout: float = 0.01):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/score")
        self.rewards = {r.name: r for r in rewards}

    def setup(self, device) -> None:
        if multiprocessing.parent_process() is not None and threading.current_thread() is threading.main_thread():
            # an inference worker: Ctrl-C reaches the whole process group, and the main process stops the workers
            # (LitServe's shutdown); ignoring it here spares a KeyboardInterrupt traceback from LitServe's loop
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        for reward in self.rewards.values():
            if isinstance(reward, ModelReward):
                reward.load(reward.device or device)

    def decode_request(self, request: dict):  # dict: FastAPI parses the body (see `bad_body` for malformed JSON)
        try:
            decoded = decode_score_request(request)
        except ValueError as err:
            return {"error": (400, f"bad request: {err}")}
        names = decoded["names"] or list(self.rewards)
        unknown = sorted(set(names) - set(self.rewards))
        if unknown:
            return {"error": (400, f"bad request: unknown reward(s) {unknown} in rewards; this server serves "
                                   f"{sorted(self.rewards)}")}
        return {**decoded, "names": names}

    def batch(self, inputs: list[dict]) -> list[dict]:
        return inputs

    def unbatch(self, outputs: list[dict]) -> list[dict]:
        return outputs

    def predict(self, requests: list[dict] | dict) -> list[dict] | dict:
        single = isinstance(requests, dict)  # max_batch_size=1: LitServe passes one request
        requests = [requests] if single else requests
        scores: list[dict[str, torch.Tensor]] = [{} for _ in requests]
        errors: dict[int, tuple[int, str]] = {i: r["error"] for i, r in enumerate(requests) if "error" in r}
        by_size: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            if i not in errors:
                by_size.setdefault(tuple(request["images"].shape[1:]), []).append(i)  # (3, H, W) or (F, 3, H, W)
        for rows in by_size.values():
            for name, reward in self.rewards.items():
                wanted = [i for i in rows if i not in errors and name in requests[i]["names"]]
                if not wanted:
                    continue
                try:
                    self._score_together(reward, [requests[i] for i in wanted], [scores[i] for i in wanted])
                except Exception:  # noqa: BLE001 - which request is at fault? score each on its own
                    for i in wanted:
                        try:
                            self._score_together(reward, [requests[i]], [scores[i]])
                        except Exception as err:  # noqa: BLE001 - this request's answer
                            errors[i] = failure(reward, err)
        total = sum(len(r["prompts"]) for r in requests if "error" not in r)
        out = [{"error": errors[i]} if i in errors else {"scores": encode_scores(s)} for i, s in enumerate(scores)]
        for answer in out:
            answer.update(batch_requests=len(requests), batch_images=total)
        return out[0] if single else out

    @staticmethod
    def _score_together(reward: RewardCallback, requests: list[dict], into: list[dict]) -> None:
        """One ``score`` call over the concatenated requests, split back per request."""
        images = torch.cat([r["images"] for r in requests])
        prompts = [p for r in requests for p in r["prompts"]]
        keys = set.intersection(*(set(r["metadata"]) for r in requests))
        metadata = {k: torch.cat([r["metadata"][k] for r in requests]) if torch.is_tensor(requests[0]["metadata"][k])
                    else requests[0]["metadata"][k] for k in keys}
        values = reward.score(images, prompts, metadata).cpu()
        for request, target in zip(requests, into):
            target[reward.name], values = values[:len(request["prompts"])], values[len(request["prompts"]):]

    def encode_response(self, output):
        if "error" not in output:
            return output
        from fastapi.responses import JSONResponse

        status, message = output["error"]
        return JSONResponse(status_code=status, content={"detail": message, "batch_requests": output["batch_requests"]})


async def bad_body(request, exc) -> Any:
    """400 for a body FastAPI cannot hand to ``decode_request``: not JSON, or JSON but not an object."""
    from fastapi.responses import JSONResponse

    problems = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            where = error.get("loc", ("body", "?"))[-1]
            reason = (error.get("ctx") or {}).get("error", "JSON decode error")
            problems.append(f"the body is not valid JSON ({reason} at character {where})")
        else:
            got = "raw bytes" if isinstance(error.get("input"), bytes) else json_type_name(error.get("input"))
            problems.append(f"the body must be a JSON object sent with Content-Type: application/json; got {got}")
    message = "; ".join(problems or ["the body could not be read"])
    return JSONResponse(status_code=400, content={
        "detail": f"bad request: {message}: send a JSON object {{\"images\": ..., \"prompts\": [...]}}"})


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m flowrl.rewards.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action=ActionConfigFile, help="YAML with the options below")
    parser.add_argument("--rewards", type=list[RewardCallback], required=True,
                        help="reward callbacks (class_path / init_args), scored under their names")
    parser.add_argument("--host", type=str, default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max_batch_size", type=int, default=16, help="requests scored together (>= 1)")
    parser.add_argument("--batch_timeout", type=float, default=0.01, help="seconds to wait to fill a batch")
    parser.add_argument("--accelerator", type=str, default="auto", help="cpu, cuda, mps or auto")
    parser.add_argument("--devices", type=Optional[int], default=None, help="devices used (default: all)")
    parser.add_argument("--workers_per_device", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before the server drops a request")
    parser.add_argument("--log_level", type=str, default="warning")
    return parser


def main(args: Optional[list[str]] = None) -> None:
    parser = build_parser()
    config = parser.parse_args(args if args is not None else sys.argv[1:])
    problems = []
    if config.max_batch_size < 1 or config.batch_timeout < 0 or config.timeout <= 0:
        problems.append(f"max_batch_size={config.max_batch_size} must be >= 1, batch_timeout="
                        f"{config.batch_timeout} >= 0 and timeout={config.timeout} > 0")
    if not config.rewards:
        problems.append("rewards is empty: list at least one reward callback (class_path / init_args)")
    if litserve is None:
        problems.append("the reward server needs the `serve` extra: pip install 'flowrl[serve]' (litserve)")
    if problems:
        raise SystemExit("flowrl.rewards.serve: invalid configuration:\n  " + "\n  ".join(problems))
    rewards = parser.instantiate(config).rewards
    names = [r.name for r in rewards]
    if len(set(names)) != len(names):
        raise SystemExit(f"flowrl.rewards.serve: two rewards share a name in {names}; set `name` on one of them")
    api = RewardAPI(rewards, config.max_batch_size, config.batch_timeout)
    server = litserve.LitServer(api, accelerator=config.accelerator, devices=config.devices or "auto",
                                workers_per_device=config.workers_per_device, timeout=config.timeout)
    from fastapi.exceptions import RequestValidationError

    server.app.add_exception_handler(RequestValidationError, bad_body)
    received = _stop_on_signals()
    try:
        # process: LitServe's shutdown terminates the API server process (a thread it cannot stop)
        server.run(host=config.host, port=config.port, log_level=config.log_level, generate_client_file=False,
                   num_api_servers=1, api_server_worker_type="process")
    except KeyboardInterrupt:  # a signal before LitServe's own shutdown handling begins (workers still loading)
        pass
    finally:
        _stop_children()
    if received:
        raise SystemExit(128 + received[0])


def _stop_on_signals() -> list[int]:
    """SIGTERM and SIGINT in this process become one ``KeyboardInterrupt``, which ``LitServer.run`` answers with its
    graceful shutdown (workers, API server and queue manager stopped); a second signal during it is ignored rather
    than breaking it off. Returns the list that receives the signal number. Processes forked from this one inherit
    the handler, and die of the signal as by default."""
    received: list[int] = []
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:  # a forked child (the API server, the queue manager): the default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if received:
            return
        received.append(signum)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)
    return received


def _stop_children(timeout: float = 10.0) -> None:
    """Terminate (then kill) every process this one started and has not reaped: after LitServe's shutdown there
    are none; after a signal that came while the workers were still loading, this stops them. Then stop and reap
    multiprocessing's resource tracker, so that no process outlives this one (not even as a zombie for init)."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
    from multiprocessing import resource_tracker

    try:  # private but stable (3.8-3.13); without it the tracker exits on its own once this process has
        resource_tracker._resource_tracker._stop()
    except Exception:  # noqa: BLE001 - best effort
        pass


if __name__ == "__main__":
    main()
