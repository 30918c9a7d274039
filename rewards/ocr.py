"""Text-rendering accuracy, as Flow-GRPO's OCR reward (arXiv 2505.05470, ``flow_grpo/ocr.py``).

The target is the prompt's first double-quoted span (``'a sign that says "Open Late"'`` -> ``Open Late``). Both the
target and the recognised text (every detected line, joined) drop their spaces and are lower-cased; the score is
``1 - min(d, n) / n`` with ``n`` the target's length and ``d`` the Levenshtein distance, and ``d = 0`` when the
target appears inside the recognised text. Scores lie in ``[0, 1]``: 1 for an exact rendering, 0 for nothing
readable.

Deliberate deviations from Flow-GRPO, both "reject, don't repair": a prompt without a quoted span (Flow-GRPO raises
an ``IndexError``) or with an empty one (a division by zero there) is a ``ValueError`` naming the prompt, and an
engine that crashes raises instead of scoring 0.

The engine is pluggable: any callable ``engine(image: PIL.Image) -> str``. The default, :class:`RapidOcrEngine`,
runs PaddleOCR's detection and recognition models through ``rapidocr`` + ``onnxruntime`` (the ONNX files ship in
the wheel; no download), with the angle classifier off and text lines below confidence 0.5 dropped, the settings
of Flow-GRPO's ``PaddleOCR(use_angle_cls=False)``.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import torch
from PIL import Image
from torch import Tensor

from flowrl.rewards.base import RewardCallback
from flowrl.rewards.pil_images import to_pil
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec

EXTRA_HINT = 'pip install "flowrl[rewards]"'
QUOTED = re.compile(r'"([^"]*)"')


def quoted_text(prompt: str) -> str:
    """The first double-quoted span of ``prompt``: the text the image should render.

    >>> quoted_text('a neon sign that says "Open Late" above a door')
    'Open Late'

    Raises:
        ValueError: no quoted span, or an empty one: OCR accuracy is undefined for that prompt.
    """
    match = QUOTED.search(prompt)
    if match is None or not normalise(match.group(1)):
        raise ValueError(f"OCR reward: prompt {prompt!r} has no non-empty text in double quotes; OCR prompts name "
                         f'the text to render as in \'a sign that says "Open"\'')
    return match.group(1)


def normalise(text: str) -> str:
    """Flow-GRPO's normalisation: spaces removed (other whitespace kept), lower-cased.

    >>> normalise("Open  Late 24H")
    'openlate24h'
    """
    return text.replace(" ", "").lower()


def ocr_accuracy(recognized: str, target: str) -> float:
    """``1 - min(d, n) / n`` for the normalised texts (``d = 0`` if the target is contained in the recognised text).

    >>> ocr_accuracy("OPEN LATE", "Open Late"), ocr_accuracy("Opcn Late", "Open Late"), ocr_accuracy("", "Open")
    (1.0, 0.875, 0.0)
    """
    from rapidfuzz.distance import Levenshtein

    recognized, target = normalise(recognized), normalise(target)
    distance = 0 if target in recognized else Levenshtein.distance(recognized, target)
    return 1.0 - min(distance, len(target)) / len(target)


def require_extra(module: str) -> None:
    """Raises an ``ImportError`` that names the extra when ``module`` (from ``flowrl[rewards]``) is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ImportError(f"the OCR reward needs {module!r}, which is not installed; install the extra: {EXTRA_HINT}")


class RapidOcrEngine:
    """``rapidocr`` on ``onnxruntime``: recognised lines joined, in reading order. Loads on the first call.

    Args:
        text_score: lines recognised below this confidence are dropped (PaddleOCR's ``drop_score``, 0.5).
        use_cls: run the text-angle classifier (Flow-GRPO: off).
        threads: onnxruntime intra-op threads (``-1``: onnxruntime's default).
    """

    def __init__(self, text_score: float = 0.5, use_cls: bool = False, threads: int = -1):
        for module in ("rapidocr", "onnxruntime"):
            require_extra(module)
        self.text_score, self.use_cls, self.threads = text_score, use_cls, threads
        self._ocr = None

    def __call__(self, image: Image.Image) -> str:
        if self._ocr is None:
            from rapidocr import RapidOCR

            self._ocr = RapidOCR(params={"Global.log_level": "warning", "Global.text_score": self.text_score,
                                         "Global.use_cls": self.use_cls,
                                         "EngineConfig.onnxruntime.intra_op_num_threads": self.threads})
        # a PIL image, not an array: rapidocr reads arrays as BGR (Flow-GRPO hands PaddleOCR RGB arrays as BGR)
        result = self._ocr(image.convert("RGB"))
        return "".join(result.txts or ())


class OcrReward(RewardCallback):
    """Accuracy of the text rendered in each image against the prompt's quoted text, in ``[0, 1]``.

    Args:
        engine: ``engine(image: PIL.Image) -> str``; default :class:`RapidOcrEngine` (needs ``flowrl[rewards]``).
        weight, name, batch_size, frames, frame_reduction: as :class:`~flowrl.rewards.RewardCallback`.

    Raises:
        ImportError: the ``rewards`` extra is missing (at construction, before any training).
    """

    default_name = "ocr"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 16,
                 engine: Optional[Callable[[Image.Image], str]] = None, frames: FrameSpec = DEFAULT_FRAMES,
                 frame_reduction: str = "mean"):
        super().__init__(weight, name, batch_size, frames, frame_reduction)
        require_extra("rapidfuzz")
        self.engine = engine if engine is not None else RapidOcrEngine()

    def score(self, images: Tensor, prompts: list[str], metadata: Optional[dict[str, Any]] = None) -> Tensor:
        for prompt in prompts:  # a prompt without quoted text fails before any OCR runs
            quoted_text(prompt)
        return super().score(images, prompts, metadata)

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        targets = [quoted_text(p) for p in prompts]
        scores = [ocr_accuracy(self.engine(image), target) for image, target in zip(to_pil(images), targets)]
        return torch.tensor(scores, dtype=torch.float32)
