"""The reward server's LitServe API in process, without HTTP: a request that fails is answered alone (its own
status and message) and the requests of its batch are scored; the same with one request per batch
(``max_batch_size=1``, where LitServe passes a single request instead of a list)."""

import pytest
import torch

from flowrl.rewards.protocol import decode_scores, encode_images
from tests.rewards.served import MeanPixel

serve = pytest.importorskip("flowrl.rewards.serve")
pytest.importorskip("litserve", reason="the reward server needs the `serve` extra")


def body(n, prompt="p", size=16, **changes):
    x = torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(n))
    return x, {"images": encode_images(x, "array"), "prompts": [prompt] * n, **changes}


@pytest.fixture
def api():
    return serve.RewardAPI([MeanPixel(name="mean"), MeanPixel(name="sized", size=16),
                            MeanPixel(name="broken", crash_on="crash")], max_batch_size=8)


def test_each_request_of_a_batch_gets_its_own_answer(api):
    requests = [body(2), body(1, prompt="crash"), body(3, size=8, rewards=["sized"]), body(1, rewards="mean"),
                body(2, rewards=["mean", "broken"])]
    answers = [api.encode_response(a) for a in api.unbatch(api.predict(api.batch(
        [api.decode_request(b) for _, b in requests])))]
    statuses = [getattr(a, "status_code", 200) for a in answers]
    assert statuses == [200, 500, 400, 400, 200]
    assert b"reward 'broken' failed: RuntimeError: the scorer crashed" in answers[1].body
    assert b"reward 'sized' cannot score this request: ValueError: this model takes 16x16 images" in answers[2].body
    assert b"rewards must be a list of reward names" in answers[3].body
    for (x, _), answer in ((requests[0], answers[0]), (requests[4], answers[4])):
        scores = decode_scores(answer["scores"])
        assert torch.allclose(scores["mean"], x.mean(dim=(1, 2, 3)))
        assert answer["batch_requests"] == 5 and answer["batch_images"] == 2 + 1 + 3 + 2  # 4th did not decode
    assert set(decode_scores(answers[0]["scores"])) == {"mean", "sized", "broken"}  # no `rewards`: all of them


def test_one_request_per_batch(api):
    x, good = body(2)
    answer = api.encode_response(api.predict(api.decode_request(good)))
    assert torch.allclose(decode_scores(answer["scores"])["mean"], x.mean(dim=(1, 2, 3)))
    rejected = api.encode_response(api.predict(api.decode_request(body(1, size=8, rewards=["sized"])[1])))
    assert rejected.status_code == 400 and b"reward 'sized' cannot score" in rejected.body
