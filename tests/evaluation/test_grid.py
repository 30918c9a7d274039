"""The report's image grid writes every metric name and prompt whole: wrapped to its cell (the sample grid's
``fitted_lines``), never cut and never over the next image."""

import numpy as np
from PIL import Image, ImageDraw

from flowrl.callbacks.sample_grid import fitted_lines
from flowrl.evaluation.figures import paired_grid

CELL, LABEL, LINE, HEADER = 112, 150, 12, 36  # paired_grid's defaults, line height and header (3 lines)


def ink(picture: Image.Image, box: tuple[int, int, int, int]) -> np.ndarray:
    """Rows and columns of ``box`` (left, top, right, bottom) that hold anything but white, as a boolean array."""
    return (np.asarray(picture.crop(box).convert("L")) < 250)


def test_captions_and_labels_wrap_whole_inside_their_column(tmp_path):
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength
    long_metric = "digit_alignment_with_a_much_longer_name 0.651"
    captions = [long_metric, "colour_match 0.952"]
    lines = [text for c in captions for text in fitted_lines(c, CELL - 4, measure)]
    assert len(lines) >= 3  # the long name cannot fit on one line of a 112 px cell
    label = "a photo of a red apple to the left of a blue car\ntwo objects, colours"
    white = np.full((16, 16, 3), 255, np.uint8)  # blank images: every dark pixel is text
    out = paired_grid([(label, [[white, white]], [[captions, captions]])], [0], ["base", "tuned"],
                      tmp_path / "grid.png", cell=CELL, label_width=LABEL)
    grid = Image.open(out)
    # one row: the image, 8 px, and a line per wrapped caption line (each metric starts a line of its own)
    assert grid.height == HEADER + CELL + 8 + LINE * len(lines)
    # the first image's captions: ink on every one of their lines, none past the image's right edge
    text = ink(grid, (LABEL, HEADER + CELL + 2, LABEL + CELL + 6, grid.height))
    assert not text[:, CELL:].any()
    assert all(text[k * LINE:(k + 1) * LINE].any() for k in range(len(lines)))
    # the prompt and its category: several lines, all left of the images
    labels = ink(grid, (0, HEADER, LABEL, grid.height))
    wrapped = fitted_lines(label, LABEL - 8, measure, max_lines=(CELL + 8 + LINE * len(lines) - 8) // LINE)
    assert len(wrapped) >= 3 and "".join(wrapped).replace(" ", "") == label.replace(" ", "").replace("\n", "")
    assert all(labels[4 + k * LINE:4 + (k + 1) * LINE].any() for k in range(len(wrapped)))
    assert not labels[:, LABEL - 4:].any()
