"""The reward server: any reward callbacks behind HTTP, with batching of concurrent requests.

``python -m flowrl.rewards.serve --config reward.yaml --host 127.0.0.1 --port 8000``, where ``reward.yaml`` lists
reward callbacks as in a training config::

    rewards:
      - class_path: flowrl.rewards.JpegIncompressibility
      - class_path: flowrl.rewards.DigitAlignment
        init_args: {batch_size: 64}
    max_batch_size: 16     # requests scored together
    batch_timeout: 0.01    # seconds the server waits to fill a batch

Endpoints: ``POST /score`` (format: :mod:`flowrl.rewards.protocol`) and ``GET /health`` (200 ``ok`` once every
reward is loaded). Built on Lightning's LitServe (the ``serve`` extra), which queues concurrent requests and hands
them to ``predict`` together; a batch's images are scored in one call per reward (split by image size).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch
from jsonargparse import ActionConfigFile, ArgumentParser

from flowrl.rewards.base import ModelReward, RewardCallback
from flowrl.rewards.protocol import decode_images, decode_metadata, encode_scores

try:
    import litserve
except ImportError:  # the server is optional; the parser below still documents it
    litserve = None

_API_BASE = litserve.LitAPI if litserve is not None else object


class RewardAPI(_API_BASE):
    """LitServe API that scores requests with ``rewards`` (each request may pick a subset by name)."""

    def __init__(self, rewards: list[RewardCallback], max_batch_size: int = 16, batch_timeout: float = 0.01):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/score")
        self.rewards = {r.name: r for r in rewards}

    def setup(self, device) -> None:
        for reward in self.rewards.values():
            if isinstance(reward, ModelReward):
                reward.load(reward.device or device)

    def decode_request(self, request):  # no annotation: LitServe builds the endpoint's body type from it
        from fastapi import HTTPException

        try:
            images = decode_images(request["images"])
            prompts = [str(p) for p in request["prompts"]]
            names = request.get("rewards") or list(self.rewards)
            if len(prompts) != images.shape[0]:
                raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
            unknown = sorted(set(names) - set(self.rewards))
            if unknown:
                raise ValueError(f"unknown reward(s) {unknown}; this server serves {sorted(self.rewards)}")
        except (KeyError, TypeError, ValueError) as err:
            raise HTTPException(status_code=400, detail=f"bad request: {err!r}") from err
        return {"images": images, "prompts": prompts, "names": names,
                "metadata": decode_metadata(request.get("metadata") or {}, len(prompts))}

    def batch(self, inputs: list[dict]) -> list[dict]:
        return inputs

    def unbatch(self, outputs: list[dict]) -> list[dict]:
        return outputs

    def predict(self, requests: list[dict] | dict) -> list[dict] | dict:
        single = isinstance(requests, dict)  # max_batch_size=1: LitServe passes one request
        requests = [requests] if single else requests
        scores: list[dict[str, torch.Tensor]] = [{} for _ in requests]
        by_size: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            by_size.setdefault(tuple(request["images"].shape[2:]), []).append(i)
        for rows in by_size.values():
            for name, reward in self.rewards.items():
                wanted = [i for i in rows if name in requests[i]["names"]]
                if wanted:
                    self._score_together(reward, [requests[i] for i in wanted], [scores[i] for i in wanted])
        total = sum(len(r["prompts"]) for r in requests)
        out = [{"scores": encode_scores(s), "batch_requests": len(requests), "batch_images": total} for s in scores]
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
        return output


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
    server.run(host=config.host, port=config.port, log_level=config.log_level, generate_client_file=False,
               num_api_servers=1, api_server_worker_type="thread")


if __name__ == "__main__":
    main()
