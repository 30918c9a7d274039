"""OCR reward: Flow-GRPO's edit-distance score against hand-computed cases, and the real rapidocr engine reading
text rendered with PIL."""

import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from flowrl.rewards import OcrReward
from flowrl.rewards.ocr import RapidOcrEngine, ocr_accuracy, quoted_text


def rendered(lines, size=(320, 120)):
    """Black text in PIL's default font at 36 px on white, as an image tensor [1, 3, H, W] in [0, 1]."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        draw.text((12, 12 + 48 * row), line, fill="black", font=ImageFont.load_default(size=36))
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float() / 255


class ScriptedEngine:
    """Returns fixed texts in turn and records how often it ran."""

    def __init__(self, texts):
        self.texts, self.calls = list(texts), 0

    def __call__(self, image):
        assert isinstance(image, Image.Image) and image.mode == "RGB"
        self.calls += 1
        return self.texts[(self.calls - 1) % len(self.texts)]


@pytest.mark.parametrize("recognized, target, expected", [
    ("Hello World", "hello world", 1.0),             # case and spaces removed: "helloworld" == "helloworld"
    ("SALE! hello world 50%", "Hello World", 1.0),   # target contained in the recognised text: d = 0
    ("Helo World", "Hello World", 1 - 1 / 10),       # one deletion, n = len("helloworld") = 10
    ("kitten", "sitting", 1 - 3 / 7),                # the textbook Levenshtein distance 3
    ("", "Open", 0.0),                               # nothing read: d = n
    ("zzzzzzzzzzzzzzzzzzzz", "Open", 0.0),           # d = 20 > n = 4 is clipped to n
    ("Open\tLate", "Open Late", 1 - 1 / 8),          # only spaces go: the tab stays, d = 1, n = len("openlate")
])
def test_edit_distance_score(recognized, target, expected):
    assert ocr_accuracy(recognized, target) == pytest.approx(expected, abs=1e-12)


def test_quoted_text_takes_the_first_span_and_rejects_prompts_without_one():
    assert quoted_text('a "first" and a "second" sign') == "first"
    for bad in ["a sign with no quotes", 'a sign saying "   "', 'an unclosed "quote']:
        with pytest.raises(ValueError, match="double quotes"):
            quoted_text(bad)


def test_reward_with_a_scripted_engine_batches_and_fails_before_ocr():
    prompts = ['a sign "Open Late"', 'a mug with "Coffee"', 'a banner "Hi"', 'the word "Dune"'] * 2
    texts = ["OPEN LATE", "Cofee", "", "Dunes and more"]
    expected = [1.0, 1 - 1 / 6, 0.0, 1.0] * 2  # "cofee" vs "coffee": one deletion, n = 6; "dune" is contained
    images = torch.rand(8, 3, 16, 16)
    for batch_size in (1, 3, 8):
        engine = ScriptedEngine(texts)
        reward = OcrReward(engine=engine, batch_size=batch_size, weight=2.0)
        assert reward.score(images, prompts).tolist() == pytest.approx(expected)
        assert engine.calls == 8
    engine = ScriptedEngine(texts)
    with pytest.raises(ValueError, match="no non-empty text in double quotes"):
        OcrReward(engine=engine, batch_size=1).score(images[:2], ['a "fine" prompt', "a prompt without quotes"])
    assert engine.calls == 0


def test_missing_extra_fails_at_construction(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rapidocr" else real(name, *a))
    with pytest.raises(ImportError, match=r'pip install "flowrl\[rewards\]"'):
        OcrReward()
    OcrReward(engine=ScriptedEngine(["x"]))  # a custom engine does not need rapidocr


@pytest.fixture(scope="module")
def rapid_engine():
    return RapidOcrEngine(threads=1)


def test_rapidocr_reads_rendered_text(rapid_engine):
    assert rapid_engine(Image.new("RGB", (200, 80), "white")) == ""  # a blank image reads as nothing
    reward = OcrReward(engine=rapid_engine)
    images = torch.cat([rendered(["Hello World"]), rendered(["Hello Wor"]), rendered(["OPEN", "LATE"])])
    prompts = ['a sign that says "Hello World"', 'a sign that says "Hello World"', 'a door sign "open late"']
    # "hellowor" vs "helloworld": two deletions, n = 10; the two lines are joined into "openlate"
    assert reward.score(images, prompts).tolist() == pytest.approx([1.0, 1 - 2 / 10, 1.0])
