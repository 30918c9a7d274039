"""The "digit canvas" task: a tiny, fully offline text-to-image problem.

The idea is to have a compositional text-to-image task small enough to train
and RL-fine-tune on a CPU in minutes, yet rich enough to expose the classic
failure modes of diffusion models (attribute binding, object counting,
left/right confusion).  A canvas is a 16x16 RGB image on a black background
holding two 8x8 scikit-learn digits side by side, each tinted with a colour.
Its prompt names both objects, e.g. ``"red 3 and blue 7"`` means a red 3 on
the left and a blue 7 on the right.

Real canvases are composed from the scikit-learn digits data set, split
deterministically into train and test images, so a reward classifier can be
trained on one split and its "ceiling" measured on the other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
}
COLOR_NAMES: list[str] = list(COLORS)
DIGITS: list[str] = [str(d) for d in range(10)]
PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
VOCAB: list[str] = [PAD_TOKEN, UNK_TOKEN, "and", *COLOR_NAMES, *DIGITS]

CANVAS_SIZE = 16
DIGIT_SIZE = 8
# Both digits sit on the same rows, vertically centred on the canvas.
TOP_ROW = (CANVAS_SIZE - DIGIT_SIZE) // 2
GRAMMAR = "'<color> <digit> and <color> <digit>' with <color> in {red, green, blue} and <digit> in 0-9"
# Every TEST_EVERY-th image of each class goes to the test split.
TEST_EVERY = 5


@dataclass(frozen=True)
class CanvasSpec:
    """What a prompt asks for: a digit and a colour on each side."""

    left_digit: int
    left_color: str
    right_digit: int
    right_color: str

    def __post_init__(self) -> None:
        for digit in (self.left_digit, self.right_digit):
            if digit not in range(10):
                raise ValueError(f"digit must be in 0..9, got {digit!r}")
        for color in (self.left_color, self.right_color):
            if color not in COLORS:
                raise ValueError(f"color must be one of {COLOR_NAMES}, got {color!r}")

    @property
    def prompt(self) -> str:
        return f"{self.left_color} {self.left_digit} and {self.right_color} {self.right_digit}"


def parse_prompt(prompt: str) -> CanvasSpec:
    """Parse a canvas prompt.

    >>> parse_prompt("red 3 and blue 7")
    CanvasSpec(left_digit=3, left_color='red', right_digit=7, right_color='blue')
    >>> parse_prompt("a red 3")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: cannot parse prompt 'a red 3': expected '<color> <digit> and <color> <digit>' ...
    """
    words = prompt.split(" ")
    valid = (
        len(words) == 5
        and words[2] == "and"
        and words[0] in COLORS
        and words[3] in COLORS
        and words[1] in DIGITS
        and words[4] in DIGITS
    )
    if not valid:
        raise ValueError(f"cannot parse prompt {prompt!r}: expected {GRAMMAR}")
    return CanvasSpec(int(words[1]), words[0], int(words[4]), words[3])


def all_specs() -> list[CanvasSpec]:
    """All 900 canvas specs in a fixed order (left colour, left digit, right colour, right digit)."""
    return [
        CanvasSpec(ld, lc, rd, rc)
        for lc, ld, rc, rd in itertools.product(COLOR_NAMES, range(10), COLOR_NAMES, range(10))
    ]


def all_prompts() -> list[str]:
    return [spec.prompt for spec in all_specs()]


def render(spec: CanvasSpec, left_img: torch.Tensor, right_img: torch.Tensor) -> torch.Tensor:
    """Compose a [3, 16, 16] canvas from two [8, 8] intensity images in [0, 1]."""
    canvas = torch.zeros(3, CANVAS_SIZE, CANVAS_SIZE)
    rows = slice(TOP_ROW, TOP_ROW + DIGIT_SIZE)
    for img, color, cols in (
        (left_img, spec.left_color, slice(0, DIGIT_SIZE)),
        (right_img, spec.right_color, slice(DIGIT_SIZE, 2 * DIGIT_SIZE)),
    ):
        rgb = torch.tensor(COLORS[color]).view(3, 1, 1)
        canvas[:, rows, cols] = rgb * torch.as_tensor(img, dtype=torch.float32)
    return canvas


@lru_cache(maxsize=None)
def digit_images(split: str) -> tuple[torch.Tensor, ...]:
    """Per-class stacks of [N_c, 8, 8] digit images in [0, 1] for one split."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    from sklearn.datasets import load_digits  # ships with sklearn, no download

    data = load_digits()
    images = torch.from_numpy(data.images.astype(np.float32) / 16.0)
    per_class = []
    for digit in range(10):
        idx = np.flatnonzero(data.target == digit)
        is_test = np.arange(len(idx)) % TEST_EVERY == TEST_EVERY - 1
        keep = idx[is_test] if split == "test" else idx[~is_test]
        per_class.append(images[torch.from_numpy(keep)])
    return tuple(per_class)


def random_specs(n: int, generator: torch.Generator) -> list[CanvasSpec]:
    specs = all_specs()
    idx = torch.randint(len(specs), (n,), generator=generator)
    return [specs[i] for i in idx.tolist()]


def render_specs(
    specs: list[CanvasSpec], generator: torch.Generator, split: str = "train"
) -> torch.Tensor:
    """Render each spec with randomly drawn digit images of the right classes."""
    pool = digit_images(split)

    def draw(digit: int) -> torch.Tensor:
        i = torch.randint(len(pool[digit]), (1,), generator=generator).item()
        return pool[digit][i]

    return torch.stack([render(s, draw(s.left_digit), draw(s.right_digit)) for s in specs])


def sample_canvases(
    n: int, generator: torch.Generator | int | None = None, split: str = "train"
) -> tuple[torch.Tensor, list[str]]:
    """Draw ``n`` random specs and real canvases for them: ([n, 3, 16, 16], prompts)."""
    if not isinstance(generator, torch.Generator):
        seed = 0 if generator is None else generator
        generator = torch.Generator().manual_seed(seed)
    specs = random_specs(n, generator)
    return render_specs(specs, generator, split), [s.prompt for s in specs]
