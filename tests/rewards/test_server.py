"""The reward server as a real process on 127.0.0.1 and the ``RemoteReward`` client: correct scores for concurrent
clients, batching of requests that arrive together, timeouts and retries on a slow reward, a clear error naming
the URL when the server is gone, and a real ``python -m flowrl fit`` scoring through the server."""

import json
import threading
import urllib.request
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from flowrl.rewards import JpegIncompressibility, RemoteReward
from flowrl.rewards.protocol import decode_scores, encode_images
from flowrl.rewards.remote import RemoteRewardError
from tests.cli.test_fit import fit_args, load_steps
from tests.rewards.server_process import kill, reward_server

pytest.importorskip("litserve", reason="the reward server needs the `serve` extra")

CONFIG = """
rewards:
  - class_path: flowrl.rewards.JpegIncompressibility
  - class_path: tests.rewards.served.MeanPixel
    init_args: {name: mean}
  - class_path: tests.rewards.served.MeanPixel
    init_args: {name: slow, delay: 1.0}
max_batch_size: 8
batch_timeout: 0.5
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("server")
    (workdir / "reward.yaml").write_text(CONFIG)
    with reward_server(str(workdir / "reward.yaml"), workdir) as (url, _):
        yield url


def images(n, seed):
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def post(url, body):
    request = urllib.request.Request(url + "/score", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_concurrent_clients_get_their_own_scores_in_one_batch(server):
    start, results = threading.Barrier(6), {}

    def client(i):
        x = images(i % 3 + 1, seed=i)
        start.wait()  # the six requests arrive together, within the server's batch_timeout
        results[i] = (x, post(server, {"images": encode_images(x), "prompts": ["p"] * len(x),
                                       "rewards": ["jpeg_incompressibility", "mean"]}))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for x, answer in results.values():
        quantized = (x * 255).round() / 255  # what a PNG carries
        scores = decode_scores(answer["scores"])
        assert set(scores) == {"jpeg_incompressibility", "mean"}  # "slow" was not asked for
        assert torch.equal(scores["jpeg_incompressibility"], JpegIncompressibility().score(quantized, ["p"] * len(x)))
        assert torch.allclose(scores["mean"], quantized.mean(dim=(1, 2, 3)), atol=1e-6)
    assert max(a["batch_requests"] for _, a in results.values()) > 1  # requests were scored together
    assert all(a["batch_images"] >= len(x) for x, a in results.values())


def test_remote_reward_matches_local_scores_in_both_encodings(server):
    x = images(5, seed=9)
    exact = RemoteReward(server, reward="mean", encoding="array", overlap=False, batch_size=2)
    assert torch.equal(exact.score(x, ["p"] * 5), x.mean(dim=(1, 2, 3)))  # float32 arrays are exact
    png = RemoteReward(server, reward="mean", encoding="png")
    assert (png.submit(x, ["p"] * 5).result() - x.mean(dim=(1, 2, 3))).abs().max() <= 0.5 / 255


def test_server_rejects_bad_requests_without_retrying(server):
    with pytest.raises(RemoteRewardError, match=r"jpeg_incompressibility.*mean.*slow|set `reward:`"):
        RemoteReward(server, retries=0).score(images(1, 0), ["p"])  # three rewards served, none chosen
    with pytest.raises(RemoteRewardError, match=r"rejected the request \(400\).*unknown reward"):
        RemoteReward(server, reward="pickscore", retries=5, backoff=30).score(images(1, 0), ["p"])


def test_slow_reward_times_out_after_every_retry_then_succeeds_with_a_longer_timeout(server):
    impatient = RemoteReward(server, reward="slow", timeout=0.3, retries=1, backoff=0.1)
    with pytest.raises(RemoteRewardError, match=rf"{server}/score did not answer after 2 attempts .*timeout 0.3s"):
        impatient.score(images(1, 1), ["p"])
    patient = RemoteReward(server, reward="slow", timeout=30, retries=0)
    x = images(2, 2)
    assert torch.allclose(patient.score(x, ["p", "q"]), ((x * 255).round() / 255).mean(dim=(1, 2, 3)), atol=1e-6)


def test_killed_server_gives_a_clear_error_naming_the_url(tmp_path):
    (tmp_path / "reward.yaml").write_text("rewards:\n  - class_path: tests.rewards.served.MeanPixel\n")
    with reward_server(str(tmp_path / "reward.yaml"), tmp_path) as (url, proc):
        remote = RemoteReward(url, retries=2, backoff=0.05, timeout=5)
        remote.setup(None, None, "fit")  # the health check passes
        assert remote.score(images(1, 3), ["p"]).shape == (1,)
        kill(proc)
        with pytest.raises(RemoteRewardError, match=rf"{url}/score did not answer after 3 attempts"):
            remote.score(images(1, 3), ["p"])
        with pytest.raises(RemoteRewardError, match=rf"{url}/health"):
            remote.setup(None, None, "fit")


def test_fit_scores_through_the_server_with_overlap(server, tiny_model_dir, tmp_path):
    chunks = ["--model.init_args.sample_chunk_size=3", "--trainer.max_steps=2"]
    remote = ["--trainer.callbacks+=flowrl.rewards.RemoteReward", f"--trainer.callbacks.url={server}",
              "--trainer.callbacks.reward=mean", "--trainer.callbacks.encoding=array"]
    local = ["--trainer.callbacks+=tests.rewards.served.MeanPixel", "--trainer.callbacks.name=mean"]
    main(fit_args(tiny_model_dir, tmp_path / "remote", *chunks, *remote))
    main(fit_args(tiny_model_dir, tmp_path / "local", *chunks, *local))
    a, b = load_steps(tmp_path / "remote"), load_steps(tmp_path / "local")
    assert sorted(a) == ["step0_rank0", "step1_rank0"]
    for key in a:  # the server scores exactly what the local callback scores, so training is identical
        assert torch.equal(a[key]["rewards"], b[key]["rewards"])
        assert torch.equal(a[key]["advantages"], b[key]["advantages"])
    wa, wb = torch.load(Path(tmp_path, "remote/dump/weights.pt")), torch.load(Path(tmp_path, "local/dump/weights.pt"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
