"""Tensor CLIP preprocessing against the published PIL pipelines (transformers' processor, HPSv2's resize-and-pad)."""

import doctest

import numpy as np
import pytest
import torch
from PIL import Image

import flowrl.rewards.clip_preprocess as clip_preprocess
import flowrl.rewards.open_clip_keys as open_clip_keys
from flowrl.rewards.clip_preprocess import ClipPreprocess

MEAN, STD = np.array([0.48145466, 0.4578275, 0.40821073]), np.array([0.26862954, 0.26130258, 0.27577711])
ONE_LEVEL = 1 / 255 / STD.min()  # one 8-bit step after normalisation


def pil_images(images: torch.Tensor) -> list[Image.Image]:
    """What every peer does with a rollout: 8-bit, then PIL."""
    return [Image.fromarray((x * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()) for x in images]


def smooth_images(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Generator-like images: smooth colour fields plus a little noise (pure noise would be an unfair extreme)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.nn.functional.interpolate(torch.rand(b, 3, h // 8 + 2, w // 8 + 2, generator=g), size=(h, w),
                                           mode="bilinear")
    return (base + 0.1 * torch.rand(b, 3, h, w, generator=g)).clamp(0, 1)


def assert_matches(ours: torch.Tensor, reference: torch.Tensor):
    """Equal up to float rounding on at least 99.5% of values, never more than one 8-bit level apart (PIL's
    fixed-point weights send values sitting on a rounding boundary the other way: 0.1-0.2% on noise images)."""
    assert ours.shape == reference.shape and ours.dtype == torch.float32
    diff = (ours - reference).abs()
    assert diff.max() <= ONE_LEVEL + 1e-5, diff.max()
    assert (diff > 1e-5).float().mean() <= 5e-3


@pytest.mark.parametrize("h, w", [(64, 64), (50, 77), (77, 50), (20, 41), (32, 32)])
def test_crop_layout_equals_the_transformers_processor(h, w):
    from transformers import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
    reference = processor(images=pil_images(images), return_tensors="pt")["pixel_values"]
    assert_matches(ClipPreprocess.from_image_processor(processor)(images), reference)


def test_crop_layout_at_the_published_224_settings():
    from transformers import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil()  # shortest_edge 224, crop 224, bicubic, OpenAI mean/std
    images = smooth_images(2, 256, 384)
    reference = processor(images=pil_images(images), return_tensors="pt")["pixel_values"]
    ours = ClipPreprocess.from_image_processor(processor)(images)
    assert ours.shape == (2, 3, 224, 224)
    assert_matches(ours, reference)


def hps_reference(image: Image.Image, size: int) -> np.ndarray:
    """HPSv2's preprocess_val written out with PIL: longest side to ``size`` (round), black pad, normalise."""
    w, h = image.size
    scale = size / max(h, w)
    new_h, new_w = round(h * scale), round(w * scale)
    canvas = Image.new("RGB", (size, size), (0, 0, 0))
    canvas.paste(image.resize((new_w, new_h), Image.BICUBIC), ((size - new_w) // 2, (size - new_h) // 2))
    return ((np.asarray(canvas, dtype=np.float64) / 255 - MEAN) / STD).transpose(2, 0, 1)


@pytest.mark.parametrize("h, w", [(64, 64), (40, 28), (28, 45), (16, 16)])
def test_pad_layout_equals_hpsv2_resize_and_pad(h, w):
    preprocess = ClipPreprocess(32, (32, 32), tuple(MEAN), tuple(STD), layout="pad")
    images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(h + w))
    reference = torch.tensor(np.stack([hps_reference(im, 32) for im in pil_images(images)]), dtype=torch.float32)
    ours = preprocess(images)
    assert_matches(ours, reference)
    if h != w:  # the pad is black before normalisation: -mean/std in the padded border
        corner = ours[0, :, 0, 0] if h < w else ours[0, :, -1, -1]
        assert torch.allclose(corner, torch.tensor(-MEAN / STD, dtype=torch.float32), atol=1e-6)


def test_unsupported_processor_settings_are_named():
    from transformers import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil(resample=2, do_center_crop=False)
    with pytest.raises(ValueError, match=r"resample=.*do_center_crop=False"):
        ClipPreprocess.from_image_processor(processor)
    with pytest.raises(ValueError, match=r"expected images \[B, 3, H, W\]"):
        ClipPreprocess.from_image_processor(CLIPImageProcessorPil())(torch.rand(3, 32, 32))


def test_doctests_of_the_reward_modules():
    # rewards/ is outside pytest's doctest paths (it installs as flowrl.rewards), so run them here.
    for module in (clip_preprocess, open_clip_keys):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
