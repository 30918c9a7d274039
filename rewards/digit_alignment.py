"""Prompt alignment on the embedded digit-canvas task: the probability that every attribute of the prompt is right.

The classifier (``rewards/digit_classifier.py``, trained by ``scripts/train_digit_classifier.py`` and shipped in
``flowrl/assets/digit-classifier``) reads the left and right digit and colour of a 16x16 canvas; the reward is the
product of the four probabilities of the prompt's attributes, in ``[0, 1]``.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from flowrl.digit_canvas import parse_prompt
from flowrl.policies.hub import resolve_model
from flowrl.rewards.base import RewardCallback


class DigitAlignment(RewardCallback):
    """Alignment of a digit canvas with its prompt (``"red 3 and blue 7"``).

    Args:
        model: ``flowrl/digit-classifier`` (embedded), a local folder or a hub id.
    """

    default_name = "digit_alignment"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 256,
                 model: str = "flowrl/digit-classifier"):
        super().__init__(weight, name, batch_size)
        self.model_path = resolve_model(model)  # a missing path fails here, at config time
        self.classifier = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.load(pl_module.device)

    def load(self, device="cpu") -> "DigitAlignment":
        from flowrl.rewards.digit_classifier import DigitCanvasClassifier

        if self.classifier is None:
            self.classifier = DigitCanvasClassifier.from_pretrained(self.model_path).eval().requires_grad_(False)
        self.classifier.to(device)
        return self

    def _score(self, images, prompts, metadata) -> Tensor:
        if self.classifier is None:
            self.load(images.device)
        specs = [parse_prompt(p) for p in prompts]
        return self.classifier.alignment(images.to(next(self.classifier.parameters()).device), specs)
