"""Activation memory of HunyuanVideo 1.5's transformer per token and per video size, measured on the CPU: the bytes
one published-width double-stream block (``HunyuanVideo15Transformer3DModel``'s defaults: 2048 wide, 16 heads of
128, MLP x4; random weights) saves for its backward, for one text-to-video sample of a given size. Every sample
carries 1,985 context tokens besides its video tokens (1,000 Qwen2.5-VL + 256 ByT5 + 729 vision tokens, padding
masked, as the pipeline passes them), and ``(H / 16) (W / 16) ((F - 1) / 4 + 1)`` video tokens.

    OMP_NUM_THREADS=1 python scripts/hunyuan15_activation_memory.py [--sizes 64x64x5 128x128x5 128x128x9]

A LoRA fit needs the gradient to flow through every frozen block, so the input's gradient is asked for (the weights
stay frozen; LoRA's own low-rank saves are not counted). Saved tensors are counted once per storage, float32 (the
masked joint attention saved no ``[heads, N, N]`` term here: the bytes grow linearly in the tokens). The published
model has 54 blocks; with gradient checkpointing a block keeps only its inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.block_activations import block_saved_bytes, one_block_model  # noqa: E402

CONTEXT = 1000 + 256 + 729  # Qwen2.5-VL tokens, ByT5 tokens, vision tokens (HunyuanVideo15Pipeline's)


def saved_bytes(model, height: int, width: int, frames: int) -> int:
    """Bytes of distinct storages block 0 saves for the backward of one sample of ``frames`` frames at
    ``height x width`` pixels (latent 16x spatial, 4x temporal; 64 real prompt tokens)."""
    cfg = model.config
    shape = (1, cfg.in_channels, (frames - 1) // 4 + 1, height // 16, width // 16)
    mask = torch.zeros(1, 1000)
    mask[:, :64] = 1
    return block_saved_bytes(model, model.transformer_blocks[0], lambda: model(
        hidden_states=torch.randn(shape, requires_grad=True), timestep=torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(1, 1000, cfg.text_embed_dim), encoder_attention_mask=mask,
        encoder_hidden_states_2=torch.zeros(1, 256, cfg.text_embed_2_dim), encoder_attention_mask_2=torch.zeros(1, 256),
        image_embeds=torch.zeros(1, 729, cfg.image_embed_dim), return_dict=False))


def main() -> None:
    from diffusers import HunyuanVideo15Transformer3DModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64x64x5", "128x128x5", "128x128x9"],
                        help="HxWxF video sizes in pixels and frames")
    args = parser.parse_args()
    model, depth = one_block_model(HunyuanVideo15Transformer3DModel)
    print(f"{'size':>12}{'video':>7}{'tokens':>8}{'MiB/block':>11}{'KiB/token':>11}{f'GiB x{depth}':>9}")
    for size in args.sizes:
        h, w, f = (int(v) for v in size.split("x"))
        video = (h // 16) * (w // 16) * ((f - 1) // 4 + 1)
        saved = saved_bytes(model, h, w, f)
        tokens = video + CONTEXT
        print(f"{size:>12}{video:>7}{tokens:>8}{saved / 2**20:>11.1f}{saved / tokens / 2**10:>11.1f}"
              f"{depth * saved / 2**30:>9.2f}")


if __name__ == "__main__":
    main()
