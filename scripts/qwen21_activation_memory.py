"""Activation memory of Qwen-Image 2.1's transformer per token and per resolution, measured on the CPU: the bytes one
published-width block (``QwenImage21Transformer2DModel``'s defaults: 4096 wide, 32 heads, SwiGLU x3; random
weights) saves for its backward at the token counts of square images (its weights, which matmuls also save, are
not activations and are not counted). With gradient checkpointing a block keeps only its input, ``tokens x 4096``
values (16 KiB a token in float32), and recomputes the rest in the backward.

    OMP_NUM_THREADS=1 python scripts/qwen21_activation_memory.py [--sizes 256 384 512] [--text 64]

A LoRA fit needs the gradient to flow through every frozen block, so the input's gradient is asked for (the weights
stay frozen; LoRA's own low-rank saves are not counted). Saved tensors are counted once per storage, float32 (the
counting is exact for the dtype it runs in; bf16 autocast stores most of them at half the bytes, not measured here).
The 32 blocks of the model save 32 times one block's bytes; the root (embeddings, modulation, output) is not counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.block_activations import block_saved_bytes, one_block_model  # noqa: E402


def saved_bytes(model, tokens: int, text: int) -> int:
    """Bytes of distinct storages the blocks save for the backward of one sample of ``text`` text tokens and a square
    image of ``tokens`` latent tokens."""
    side = int(tokens ** 0.5)
    latents = torch.randn(1, tokens, model.config.in_channels, requires_grad=True)
    img_mask = torch.cat([torch.zeros(1, text, dtype=torch.bool), torch.ones(1, tokens // 4, dtype=torch.bool)], 1)
    return block_saved_bytes(model, model.transformer_blocks[0], lambda: model(
        hidden_states=latents, encoder_hidden_states=torch.randn(1, text, model.config.context_in_dim),
        timestep=torch.tensor([0.5]), img_shapes=[[(1, side, side)]], img_mask=img_mask, return_dict=False))


def main() -> None:
    from diffusers import QwenImage21Transformer2DModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 384, 512], help="image sides in pixels")
    parser.add_argument("--text", type=int, default=64, help="prompt tokens")
    args = parser.parse_args()
    model, depth = one_block_model(QwenImage21Transformer2DModel)
    print(f"{'pixels':>7}{'tokens':>8}{'MiB/block':>11}{'KiB/token':>11}{f'GiB x{depth}':>9}")
    for px in args.sizes:
        tokens = (px // 16) ** 2
        saved = saved_bytes(model, tokens, args.text)
        print(f"{px:>7}{tokens:>8}{saved / 2**20:>11.1f}{saved / (tokens + args.text) / 2**10:>11.1f}"
              f"{depth * saved / 2**30:>9.2f}")


if __name__ == "__main__":
    main()
