"""Prompt alignment on the embedded digit-canvas task: the probability that every attribute of the prompt is right.

The classifier (``rewards/digit_classifier.py``, trained by ``scripts/train_digit_classifier.py`` and shipped in
``flowrl/assets/digit-classifier``) reads the left and right digit and colour of a 16x16 canvas; the reward is the
product of the four probabilities of the prompt's attributes, in ``[0, 1]``.
"""

from __future__ import annotations

import contextlib
import io
from typing import Optional

import torch
from torch import Tensor

from flowrl.digit_canvas import CANVAS_SIZE, parse_prompt
from flowrl.model_paths import resolve_model
from flowrl.rewards.base import ModelReward
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


class DigitAlignment(ModelReward):
    """Alignment of a digit canvas with its prompt (``"red 3 and blue 7"``).

    Args:
        model: ``flowrl/digit-classifier`` (embedded), a local folder or a hub id.
    """

    default_name = "digit_alignment"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 256,
                 model: str = "flowrl/digit-classifier", device: Optional[str] = None, dtype: str = "float32",
                 frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        super().__init__(resolve_model(model), weight, name, batch_size, device, dtype,  # a missing path fails now
                         frames, frame_reduction)

    def _load(self, model, device, dtype):
        from flowrl.rewards.digit_classifier import DigitCanvasClassifier

        with contextlib.redirect_stdout(io.StringIO()):  # huggingface_hub prints "Loading weights from local
            classifier = DigitCanvasClassifier.from_pretrained(model)  # directory" for every local folder it loads
        return classifier.eval().requires_grad_(False).to(device, dtype)

    def _score(self, images, prompts, metadata) -> Tensor:
        if tuple(images.shape[-2:]) != (CANVAS_SIZE, CANVAS_SIZE):  # a ValueError: the reward server answers 400
            raise ValueError(f"reward {self.name!r}: the digit classifier reads {CANVAS_SIZE}x{CANVAS_SIZE} canvases;"
                             f" got {images.shape[-2]}x{images.shape[-1]} images")
        specs = [parse_prompt(p) for p in prompts]
        return self.model.alignment(images.to(self.model_device, self.dtype), specs)

    @torch.no_grad()
    def image_features(self, images: Tensor) -> Tensor:
        """The classifier's penultimate features ``[B, 128]`` of canvases ``[B, 3, 16, 16]`` (what its four heads
        read): the feature space in which ``python -m flowrl evaluate`` measures drift and diversity."""
        return self.model.embed(images.to(self.model_device, self.dtype)).float()
