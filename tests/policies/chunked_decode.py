"""Chunked VAE decoding (``vae_chunk_size``) checked on a policy: the images equal those of one whole-batch decode,
and the VAE is called once per chunk of at most ``vae_chunk_size`` latents."""

from __future__ import annotations

from typing import Callable

import torch


def _count_calls(vae, sizes: list, monkeypatch) -> None:
    decode = vae.decode

    def counted(z, *args, **kwargs):
        sizes.append(len(z))
        return decode(z, *args, **kwargs)

    monkeypatch.setattr(vae, "decode", counted)


def assert_decodes_in_chunks(make: Callable, monkeypatch, batch: int = 3, chunk: int = 2) -> None:
    """``make(**options)`` builds the policy; ``batch`` latents decode in ``ceil(batch / chunk)`` VAE calls to the
    images of a single call."""
    whole, chunked = make(), make(vae_chunk_size=chunk)
    z = torch.randn(batch, *whole.latent_shape(), generator=torch.Generator().manual_seed(0))
    whole_sizes, chunk_sizes = [], []
    _count_calls(whole.vae, whole_sizes, monkeypatch)
    _count_calls(chunked.vae, chunk_sizes, monkeypatch)
    with torch.no_grad():
        images = chunked.decode(z)
        torch.testing.assert_close(images, whole.decode(z))
    assert images.shape[0] == batch and images.min() >= 0 and images.max() <= 1
    assert whole_sizes == [batch]
    assert chunk_sizes == [min(chunk, batch - start) for start in range(0, batch, chunk)]  # 3 in twos: [2, 1]
