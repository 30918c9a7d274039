"""The reward server as a real process on 127.0.0.1 and the ``RemoteReward`` client: correct scores for concurrent
clients, batching of requests that arrive together, timeouts and retries on a slow reward, and a real ``python -m
flowrl fit`` scoring through the server. Faults: a request a reward rejects fails alone (400) while the requests batched with it are
scored; malformed requests get 400 naming the field; a reward's own failure is a 500 that the client quotes without
retrying. Last, SIGTERM to the server's main process stops every process of it and frees the port, and its client
then gets a clear error naming the URL (SIGINT, the same handler: ``test_server_shutdown.py``, slow)."""

import base64
import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flowrl.cli import main
import flowrl.rewards.remote as remote_module
from flowrl.rewards import DigitAlignment, JpegIncompressibility, RemoteReward
from flowrl.rewards.protocol import decode_scores, encode_images
from flowrl.rewards.remote import RemoteRewardError
from tests.cli.test_fit import fit_args, load_steps
from tests.rewards.server_process import assert_a_signal_stops_every_process, reward_server

# one xdist worker runs this file (pytest's --dist loadgroup): its module's reward server process is built once, not
# once per worker
pytestmark = pytest.mark.xdist_group("reward_server")

pytest.importorskip("litserve", reason="the reward server needs the `serve` extra")

CONFIG = """
rewards:
  - class_path: flowrl.rewards.JpegIncompressibility
  - class_path: tests.rewards.served.MeanPixel
    init_args: {name: mean}
  - class_path: tests.rewards.served.MeanPixel
    init_args: {name: slow, delay: 1.0}
  - class_path: flowrl.rewards.DigitAlignment
  - class_path: tests.rewards.served.MeanPixel
    init_args: {name: sized, size: 16}
  - class_path: tests.rewards.served.MeanPixel
    init_args: {name: broken, crash_on: crash}
  - class_path: flowrl.rewards.FunctionReward
    init_args: {function: tests.rewards.served.mean_or_words, name: words}
max_batch_size: 8
batch_timeout: 0.5
"""


@pytest.fixture(scope="module")
def server_process(tmp_path_factory):
    """The module's server, ``(url, process)``: its last test stops it with SIGTERM."""
    workdir = tmp_path_factory.mktemp("server")
    (workdir / "reward.yaml").write_text(CONFIG)
    with reward_server(str(workdir / "reward.yaml"), workdir) as (url, proc):
        yield url, proc


@pytest.fixture
def server(server_process):
    url, proc = server_process
    assert proc.poll() is None, "the module's server was stopped before this test (its SIGTERM test runs last)"
    return url


def images(n, seed):
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def post(url, body):
    request = urllib.request.Request(url + "/score", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def post_raw(url, data: bytes):
    """``(status, decoded JSON body)`` of ``POST /score`` with ``data``, errors included."""
    request = urllib.request.Request(url + "/score", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


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
        RemoteReward(server, retries=0).score(images(1, 0), ["red 3 and blue 7"])  # several served, none chosen
    with pytest.raises(RemoteRewardError, match=r"rejected the request \(400\).*unknown reward"):
        RemoteReward(server, reward="pickscore", retries=5, backoff=30).score(images(1, 0), ["p"])


def test_slow_reward_times_out_after_every_retry_then_succeeds_with_a_longer_timeout(server):
    impatient = RemoteReward(server, reward="slow", timeout=0.3, retries=1, backoff=0.1)
    with pytest.raises(RemoteRewardError, match=rf"{server}/score did not answer after 2 attempts .*timeout 0.3s"):
        impatient.score(images(1, 1), ["p"])
    patient = RemoteReward(server, reward="slow", timeout=30, retries=0)
    x = images(2, 2)
    assert torch.allclose(patient.score(x, ["p", "q"]), ((x * 255).round() / 255).mean(dim=(1, 2, 3)), atol=1e-6)


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


DIGIT_PROMPTS = ["red 3 and blue 7", "green 0 and red 9", "blue 5 and blue 5", "red 1 and green 2"]


def test_a_request_the_reward_rejects_fails_alone_and_its_batch_is_scored(server):
    """Eight requests at once (one batch: max_batch_size 8, batch_timeout 0.5 s); one holds a prompt DigitAlignment
    cannot parse. It gets 400 naming the reward and its message; the seven others get their scores. Three rounds,
    since which requests share a batch depends on timing."""
    digit = DigitAlignment().load("cpu")
    shared = []
    for round_ in range(3):
        start, answers = threading.Barrier(8), {}

        def client(i):
            x = images(2, seed=100 * round_ + i)
            prompts = ["red 1 and blue 2", "a cat"] if i == 7 else [DIGIT_PROMPTS[(i + k) % 4] for k in range(2)]
            body = {"images": encode_images(x, "array"), "prompts": prompts, "rewards": ["digit_alignment"]}
            start.wait()  # the eight requests arrive together, within the server's batch_timeout
            answers[i] = (x, prompts, post_raw(server, json.dumps(body).encode()))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for x, prompts, (status, body) in (answers[i] for i in range(7)):
            assert status == 200, body
            expected = digit.score(x, prompts)
            torch.testing.assert_close(decode_scores(body["scores"])["digit_alignment"], expected, atol=1e-5, rtol=0)
        status, body = answers[7][2]
        assert status == 400, body
        assert "reward 'digit_alignment' cannot score this request" in body["detail"]
        assert "cannot parse prompt 'a cat'" in body["detail"]
        shared.append(answers[7][2][1]["batch_requests"])
    assert max(shared) > 1  # the rejected request shared a batch with valid ones in at least one round


def _png(size):
    return encode_images(torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(size)))


def _body(**changes):
    body = {"images": _png(16), "prompts": ["red 3 and blue 7"], "rewards": ["mean"]}
    return json.dumps({**body, **changes}).encode()


_NOT_PNG = {"encoding": "png", "data": [base64.b64encode(b"hello, not an image").decode()]}
_DIGIT_32 = _body(images=_png(32), rewards=["digit_alignment"])


@pytest.mark.parametrize("data, message", [
    (b'{"images": {"encoding": "png", "data": [', "the body is not valid JSON"),
    (b'["red 3 and blue 7"]', "the body must be a JSON object"),
    (_body(images=_NOT_PNG), "images.data[0] is not a base64 PNG image"),
    (_body(images={"encoding": "png", "data": ["%% not base64 %%"]}), "images.data[0] is not valid base64"),
    (_body(images={"encoding": "png", "data": []}, prompts=[]), "images.data is empty: send at least one"),
    (_body(images={"encoding": "array", "shape": [0, 3, 16, 16], "data": ""}, prompts=[]),
     "images.shape=[0, 3, 16, 16] must be [B, 3, H, W] or [B, F, 3, H, W] with B, F, H, W >= 1"),
    (_body(images={"encoding": "jpeg", "data": []}), "images.encoding='jpeg'; choose one of ('png', 'array')"),
    (_body(images=_png(32), rewards=["sized"]),
     "reward 'sized' cannot score this request: ValueError: this model takes 16x16 images; got 32x32"),
    (_DIGIT_32, "reward 'digit_alignment' cannot score this request: ValueError: reward 'digit_alignment': the "
                "digit classifier reads 16x16 canvases; got 32x32 images"),
    (_body(metadata=[1, 2]), "metadata must be an object"),
    (_body(rewards="mean"), 'rewards must be a list of reward names, e.g. ["mean"]; got a string'),
    (_body(prompts="red 3 and blue 7"), "prompts must be a list of strings, one per image (1); got a string"),
    (_body(prompts=["a", "b"]), "1 images but 2 prompts"),
    (_body(prompts=[3]), "prompts[0] is a number; every prompt must be a string"),
    (b'{"prompts": ["red 3 and blue 7"]}', "the body lacks ['images']"),
], ids=["not-json", "not-an-object", "not-a-png", "not-base64", "no-png", "no-array-image", "unknown-encoding",
        "size-the-reward-rejects", "size-digit-alignment-rejects", "metadata-not-object", "rewards-a-string",
        "prompts-a-string", "prompt-count", "prompt-not-string", "no-images"])
def test_malformed_requests_get_400_naming_the_problem(server, data, message):
    status, body = post_raw(server, data)
    assert (status, message in body.get("detail", "")) == (400, True), body


def test_a_reward_failing_on_its_own_is_a_500_the_client_quotes_without_retrying(server, monkeypatch):
    """A reward that raises RuntimeError, or returns words instead of scores, is the server's fault: 500 with the
    reward's name and message, which RemoteReward reports at once (no retry, no backoff sleep)."""
    attempts, sleeps, urlopen = [], [], urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: attempts.append(1) or urlopen(*a, **k))
    monkeypatch.setattr(remote_module, "time", SimpleNamespace(sleep=sleeps.append))
    broken = RemoteReward(server, reward="broken", retries=5, backoff=30, overlap=False)
    with pytest.raises(RemoteRewardError, match=r"failed on the request \(500\): reward "
                                                r"'broken' failed: RuntimeError: the scorer crashed \(CUDA error"):
        broken.score(images(1, 4), ["crash"])
    words = RemoteReward(server, reward="words", retries=5, backoff=30, overlap=False)
    with pytest.raises(RemoteRewardError, match=r"\(500\): reward 'words' failed: "
                                                r"RewardOutputError: .*returned a list of str \(\['high'\]\)"):
        words.score(images(1, 4), ["words"])
    assert (len(attempts), sleeps) == (2, [])  # one request each, never retried
    x = images(2, 5)  # the same rewards score other prompts: the server itself is fine
    assert torch.allclose(broken.score(x, ["p", "q"]), ((x * 255).round() / 255).mean(dim=(1, 2, 3)), atol=1e-6)


# keep this test last in the file: it stops the module's server (a server of its own would cost one more start-up)
def test_sigterm_stops_every_server_process_and_frees_the_port(server_process):
    assert_a_signal_stops_every_process(*server_process, signal.SIGTERM, reward="mean")
