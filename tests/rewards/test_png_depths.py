"""The reward server reads a 16-bit PNG as its pixels: Pillow's convert("RGB") clipped every value above 255 to white,
so a client sending a 16-bit grayscale PNG was scored on a white image."""

import base64
import io

import numpy as np
import torch
from PIL import Image

from flowrl.rewards.protocol import decode_images


def png_payload(*arrays: np.ndarray) -> dict:
    data = []
    for array in arrays:
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        data.append(base64.b64encode(buffer.getvalue()).decode())
    return {"encoding": "png", "data": data}


def test_a_16_bit_grayscale_png_is_scaled_not_clipped_to_white():
    grey = np.full((4, 6), 20000, np.uint16)  # mid-grey in 16 bits (I;16)
    images = decode_images(png_payload(grey))
    assert images.shape == (1, 3, 4, 6) and images.dtype == torch.float32
    assert torch.allclose(images, torch.full_like(images, 20000 / 65535), atol=1e-6)


def test_8_bit_pngs_read_as_before():
    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3) * 3
    images = decode_images(png_payload(rgb, rgb[..., 0].copy()))  # an RGB and an 8-bit grayscale PNG
    assert torch.equal(images[0], torch.from_numpy(rgb).permute(2, 0, 1).float() / 255)
    assert torch.equal(images[1], (torch.from_numpy(rgb[..., 0].copy()).float() / 255).expand(3, 4, 6))
