"""VlmJudge against a real OpenAI-compatible chat-completions server on 127.0.0.1 (stdlib ``http.server`` in a
thread) that checks each request's shape, decodes the image, and answers with scripted replies."""

import base64
import io
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.rewards import VlmJudge
from flowrl.rewards.pil_images import to_pil
from flowrl.rewards.vlm_judge import VlmJudgeError, parse_score


class Judge(BaseHTTPRequestHandler):
    """Answers ``POST /v1/chat/completions`` with ``server.replies[caption]``; ``server.failures`` leading
    requests get a 503 (or, with ``server.stall``, no answer within the client's timeout)."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.attempts += 1
            fail = server.attempts <= server.failures
        if fail and server.stall:
            server.release.wait(5)
            return self.answer(200, {"choices": [{"message": {"content": "Final Score: 1"}}]})
        if fail:
            return self.answer(503, {"error": "busy"})
        if self.path != "/v1/chat/completions":
            return self.answer(404, {"error": f"no route {self.path}"})
        if self.headers.get("Authorization") != server.expected_auth:
            return self.answer(401, {"error": "bad key"})
        (message,) = body["messages"]
        *image_parts, text_part = message["content"]  # an edit's sources come before the edited image
        assert body["model"] == "judge-7b" and message["role"] == "user" and body["temperature"] == 0.0
        assert image_parts and all(p["type"] == "image_url" for p in image_parts) and text_part["type"] == "text"
        pictures = []
        for part in image_parts:
            header, data = part["image_url"]["url"].split(",", 1)
            assert header == "data:image/png;base64"
            pictures.append(np.asarray(Image.open(io.BytesIO(base64.b64decode(data)))))
        caption = re.search(r"(?:Text Caption|Instruction): \[(.*)\]$", text_part["text"]).group(1)
        with server.lock:
            server.images[caption], server.all_images[caption] = pictures[-1], pictures
            server.texts[caption] = text_part["text"]
        self.answer(200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                                "content": server.replies[caption]}}]})

    def answer(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    httpd.lock, httpd.release, httpd.images = threading.Lock(), threading.Event(), {}
    httpd.all_images, httpd.texts = {}, {}
    httpd.attempts, httpd.failures, httpd.stall, httpd.expected_auth = 0, 0, False, None
    httpd.replies = {"a red cat": "The cat is red and sharp.\nFinal Score: 4.5",
                     "a blue dog": "Wrong colour.\nFinal Score: 2",
                     "a green tree": "Final Score: 3 at first; after a second look, Final Score: **5**",
                     "a tall tower": "I cannot judge this image."}
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def judge(server, **kwargs):
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    return VlmJudge(url=url, model="judge-7b", **{"retries": 0, "backoff": 0.0, "timeout": 10.0, **kwargs})


def test_scores_are_parsed_and_scaled_and_images_arrive_exactly(server):
    torch.manual_seed(0)
    images = torch.rand(3, 3, 24, 20)
    prompts = ["a red cat", "a blue dog", "a green tree"]
    scores = judge(server, image_size=None, batch_size=2).score(images, prompts)
    assert scores.tolist() == pytest.approx([4.5 / 5, 2 / 5, 5 / 5])  # the last "Final Score" counts
    for image, prompt in zip(to_pil(images), prompts):  # the PNG is lossless: the 8-bit pixels, unchanged
        assert np.array_equal(server.images[prompt], np.asarray(image))
    judge(server, image_size=32).score(images[:1], prompts[:1])
    assert server.images["a red cat"].shape == (32, 32, 3)


def test_unparseable_reply_is_an_error_naming_the_reply(server):
    with pytest.raises(VlmJudgeError, match="I cannot judge this image"):
        judge(server).score(torch.rand(2, 3, 8, 8), ["a red cat", "a tall tower"])
    with pytest.raises(VlmJudgeError, match=r"outside \[0, max_score=4"):
        judge(server, max_score=4).score(torch.rand(1, 3, 8, 8), ["a red cat"])


def test_retries_after_503_and_after_a_timeout_then_fails_naming_the_url(server):
    server.failures = 2
    assert judge(server, retries=2).score(torch.rand(1, 3, 8, 8), ["a blue dog"]).tolist() == pytest.approx([0.4])
    assert server.attempts == 3
    server.attempts, server.failures, server.stall = 0, 1, True  # the first request hangs past the timeout
    scores = judge(server, retries=1, timeout=0.5).score(torch.rand(1, 3, 8, 8), ["a red cat"])
    assert scores.tolist() == pytest.approx([0.9])
    assert server.attempts == 2
    server.attempts, server.failures, server.stall = 0, 10, False
    with pytest.raises(VlmJudgeError, match=r"127\.0\.0\.1:\d+/v1/chat/completions did not answer after 2"):
        judge(server, retries=1).score(torch.rand(1, 3, 8, 8), ["a red cat"])


def test_api_key_and_client_errors(server, monkeypatch):
    server.expected_auth = "Bearer sk-test"
    with pytest.raises(VlmJudgeError, match="answered 401"):
        judge(server, retries=3).score(torch.rand(1, 3, 8, 8), ["a red cat"])
    assert server.attempts == 1  # a 4xx is not retried
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    scores = judge(server, api_key_env="JUDGE_KEY").score(torch.rand(1, 3, 8, 8), ["a red cat"])
    assert scores.tolist() == pytest.approx([0.9])


def test_bad_configuration_fails_at_construction(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError) as err:
        VlmJudge(url="127.0.0.1:8000", model="m", prompt_template="no placeholder", score_pattern="Score: \\d",
                 api_key_env="NO_SUCH_KEY")
    for fragment in ("http://host:port/v1", "{prompt}", "needs a group", "NO_SUCH_KEY"):
        assert fragment in str(err.value)


def test_parse_score_examples():
    assert parse_score("Final Score:3.25", max_score=5) == 0.65
    assert parse_score("Rating: 7/10", pattern=r"Rating: (\d+)/10", max_score=10) == 0.7
    with pytest.raises(VlmJudgeError, match="no score matching"):
        parse_score("Final Score: unclear")
