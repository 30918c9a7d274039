"""Tests for the digit canvas task and its embedded assets (classifier, tiny model).

The asset checks guard the contract the rest of flowrl relies on: the reward
separates correct from mis-bound canvases, and the tiny model loads with the
stock diffusers/transformers classes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from flowrl.digit_canvas import (
    COLORS,
    VOCAB,
    CanvasSpec,
    all_prompts,
    digit_images,
    parse_prompt,
    render,
    sample_canvases,
)

ASSETS = Path(__file__).resolve().parents[1] / "flowrl" / "assets"
TINY = ASSETS / "tiny-digits"


def test_all_prompts_round_trip():
    prompts = all_prompts()
    assert len(prompts) == len(set(prompts)) == 900
    assert all(parse_prompt(p).prompt == p for p in prompts)


@pytest.mark.parametrize(
    "bad", ["", "red 3", "red 3 or blue 7", "purple 3 and blue 7", "red 12 and blue 7", "red 3 and blue 7 "]
)
def test_parse_error_names_prompt_and_grammar(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))) as err:
        parse_prompt(bad)
    assert "<color> <digit> and <color> <digit>" in str(err.value)


def test_render_places_tinted_digits_in_their_halves():
    spec = CanvasSpec(left_digit=3, left_color="red", right_digit=7, right_color="blue")
    canvas = render(spec, torch.ones(8, 8), torch.full((8, 8), 0.5))
    assert canvas.shape == (3, 16, 16)
    left, right = canvas[:, :, :8], canvas[:, :, 8:]
    assert torch.all(left[0, 4:12] == 1) and left[1:].abs().sum() == 0
    assert torch.all(right[2, 4:12] == 0.5) and right[:2].abs().sum() == 0
    # Rows outside the digit band stay black.
    assert canvas[:, :4].abs().sum() == 0 and canvas[:, 12:].abs().sum() == 0


def test_sample_canvases_is_seeded_and_splits_are_disjoint():
    a, prompts_a = sample_canvases(8, 123, split="test")
    b, prompts_b = sample_canvases(8, torch.Generator().manual_seed(123), split="test")
    assert torch.equal(a, b) and prompts_a == prompts_b
    assert a.shape == (8, 3, 16, 16) and 0 <= a.min() and a.max() <= 1
    for train, test in zip(digit_images("train"), digit_images("test")):
        assert not (train.flatten(1)[:, None] == test.flatten(1)[None]).all(-1).any()
    assert set(VOCAB) >= set(COLORS) | {str(d) for d in range(10)} | {"and"}


def test_classifier_reward_separates_aligned_from_swapped():
    from flowrl.rewards.digit_classifier import DigitCanvasClassifier

    classifier = DigitCanvasClassifier.from_pretrained(ASSETS / "digit-classifier").eval()
    images, prompts = sample_canvases(256, 0, split="test")
    specs = [parse_prompt(p) for p in prompts]
    keep = [i for i, s in enumerate(specs) if s.left_digit != s.right_digit]
    images, specs = images[keep], [specs[i] for i in keep]
    with torch.no_grad():
        aligned = classifier.alignment(images, specs).mean()
        # Swap the two halves' digits (keeping each side's colour): the digits are mis-placed.
        gray = images.amax(1)
        swapped = torch.stack(
            [render(s, g[4:12, 8:], g[4:12, :8]) for s, g in zip(specs, gray)]
        )
        mismatched = classifier.alignment(swapped, specs).mean()
    assert aligned > 0.8, aligned
    assert mismatched < 0.2, mismatched


def test_tokenizer_reloads_with_vocab():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(TINY / "tokenizer")
    assert len(tokenizer) == len(VOCAB)
    assert tokenizer.pad_token_id == VOCAB.index("[PAD]")
    ids = tokenizer("red 3 and blue 7", padding="max_length", max_length=8).input_ids
    assert len(ids) == 8
    assert sum(i != tokenizer.pad_token_id for i in ids) == 5
    empty = tokenizer("", padding="max_length", max_length=8).input_ids
    assert empty == [tokenizer.pad_token_id] * 8


def test_tiny_model_components_load():
    from diffusers import SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    transformer = SD3Transformer2DModel.from_pretrained(TINY, subfolder="transformer")
    text_encoder = CLIPTextModelWithProjection.from_pretrained(TINY, subfolder="text_encoder")
    # Pooling happens at the first [PAD] (CLIP pools at the first eos_token_id).
    assert text_encoder.config.eos_token_id == VOCAB.index("[PAD]")
    ids = torch.tensor([[3, 9, 2, 5, 13, 0, 0, 0]])
    with torch.no_grad():
        text = text_encoder(input_ids=ids)
        out = transformer(
            hidden_states=torch.zeros(1, 3, 16, 16),
            encoder_hidden_states=text.last_hidden_state,
            pooled_projections=text.text_embeds,
            timestep=torch.tensor([500.0]),
        ).sample
    assert text.last_hidden_state.shape == (1, 8, 32) and text.text_embeds.shape == (1, 32)
    assert out.shape == (1, 3, 16, 16)
