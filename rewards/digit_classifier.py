"""Prompt-alignment reward for the digit canvas task.

A small CNN reads a 16x16 canvas and predicts, independently, the digit and
the colour on each side.  Because every attribute gets its own softmax head,
the product of the four probabilities assigned to the attributes a prompt
asks for is the model's probability that the image gets *everything* right;
that number in [0, 1] is the RL reward (see ``alignment``).  A product rather
than a mean is deliberate: an image that draws the right digits with swapped
colours has failed the binding problem and should score near zero.

The weights live in ``flowrl/assets/digit-classifier`` and are produced by
``scripts/train_digit_classifier.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from flowrl.digit_canvas import COLOR_NAMES, CanvasSpec

MODEL_CARD = """---
{{ card_data }}
---

Reward classifier for the flowrl digit canvas task (16x16 canvases holding
two coloured scikit-learn digits). Trained by `scripts/train_digit_classifier.py`.
"""

HEADS: dict[str, int] = {
    "left_digit": 10,
    "left_color": len(COLOR_NAMES),
    "right_digit": 10,
    "right_color": len(COLOR_NAMES),
}


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.GELU(),
    )


class DigitCanvasClassifier(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="flowrl",
    tags=["flowrl", "digit-canvas", "reward-model"],
    model_card_template=MODEL_CARD,
):
    """Four-headed CNN over [B, 3, 16, 16] images in [0, 1]."""

    def __init__(self, width: int = 32, hidden: int = 128, dropout_pct: int = 10):
        super().__init__()
        # Plain int arguments only, so PyTorchModelHubMixin can serialise them to config.json.
        self.features = nn.Sequential(
            _conv_block(3, width),
            _conv_block(width, width),
            nn.MaxPool2d(2),  # 8x8: one cell per 2x2 patch, still resolves left vs right half
            _conv_block(width, 2 * width),
            nn.MaxPool2d(2),  # 4x4
            _conv_block(2 * width, 2 * width),
        )
        # Flatten rather than global-pool: the heads need to know *where* a feature is.
        self.trunk = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout_pct / 100),
            nn.Linear(2 * width * 16, hidden),
            nn.GELU(),
        )
        self.heads = nn.ModuleDict({name: nn.Linear(hidden, n) for name, n in HEADS.items()})

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The features every head reads, ``[B, hidden]``."""
        # Centre inputs so that black background is not a "dead" zero input for BatchNorm.
        return self.trunk(self.features(images * 2 - 1))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed(images)
        return {name: head(h) for name, head in self.heads.items()}

    @staticmethod
    def targets(specs: list[CanvasSpec], device: torch.device | None = None) -> dict[str, torch.Tensor]:
        """Class indices of each head for a list of specs."""
        values = {
            "left_digit": [s.left_digit for s in specs],
            "left_color": [COLOR_NAMES.index(s.left_color) for s in specs],
            "right_digit": [s.right_digit for s in specs],
            "right_color": [COLOR_NAMES.index(s.right_color) for s in specs],
        }
        return {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in values.items()}

    def alignment(self, images: torch.Tensor, specs: list[CanvasSpec]) -> torch.Tensor:
        """P(all four attributes of each spec are right), shape [B]."""
        if len(specs) != images.shape[0]:
            raise ValueError(f"got {images.shape[0]} images but {len(specs)} specs")
        logits = self(images.float())
        targets = self.targets(specs, images.device)
        log_p = sum(
            F.log_softmax(logits[k], dim=-1).gather(1, targets[k][:, None]).squeeze(1) for k in HEADS
        )
        return log_p.exp()
