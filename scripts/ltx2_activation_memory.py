"""Activation memory of LTX-2's joint audio-video transformer per token and per video size, measured on the CPU: the
bytes one published-width block (``LTX2VideoTransformer3DModel``'s defaults: a 4096-wide video stream of 32 heads, a
2048-wide audio stream, their cross-modal attention; random weights) saves for its backward, at the video and audio
token counts ``LTX2Pipeline`` gives a clip (the VAE's 32x spatial and 8x temporal compression, 25 audio latent frames
a second) and the pipeline's 1024 prompt tokens (every prompt is padded to ``max_sequence_length``). Weights, which
matmuls also save, are not activations and are not counted.

    OMP_NUM_THREADS=1 python scripts/ltx2_activation_memory.py [--clips 256x256x25 256x384x25 384x384x49]

A LoRA fit needs the gradient to flow through every frozen block, so the inputs' gradients are asked for (the weights
stay frozen; LoRA's own low-rank saves are not counted). Saved tensors are counted once per storage, in float32 (bf16
autocast stores most of them at half the bytes, not measured here). The 48 blocks of the model save 48 times one
block's bytes; the root (embeddings, modulation, output) is not counted. With gradient checkpointing a block keeps
only its inputs: ``4096 + 2048`` values per video and audio token pair of streams, 16 KiB a video token in float32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: scripts/ importable
from scripts.block_activations import block_saved_bytes, one_block_model  # noqa: E402

PROMPT_TOKENS = 1024  # LTX2Pipeline pads every prompt to max_sequence_length


def clip_tokens(height: int, width: int, frames: int, fps: float = 24.0) -> tuple[int, int, tuple[int, int, int]]:
    """``(video tokens, audio tokens, (f, h, w))`` of a clip as ``LTX2Pipeline`` lays it out (Lightricks/LTX-2's VAEs).

    >>> clip_tokens(512, 768, 121)  # 16 x 16 x 24 video tokens; 121 / 24 s x 25 audio latent frames a second
    (6144, 126, (16, 16, 24))
    """
    grid = ((frames - 1) // 8 + 1, height // 32, width // 32)
    return grid[0] * grid[1] * grid[2], round(frames / fps * 25), grid


def saved_bytes(model, height: int, width: int, frames: int) -> int:
    """Bytes of distinct storages the first block saves for the backward of one clip (see the module doc)."""
    video_tokens, audio_tokens, (f, h, w) = clip_tokens(height, width, frames)
    cfg, t = model.config, torch.tensor([500.0])
    return block_saved_bytes(model, model.transformer_blocks[0], lambda: model(
        hidden_states=torch.randn(1, video_tokens, cfg.in_channels, requires_grad=True),
        audio_hidden_states=torch.randn(1, audio_tokens, cfg.audio_in_channels, requires_grad=True),
        encoder_hidden_states=torch.randn(1, PROMPT_TOKENS, cfg.caption_channels),
        audio_encoder_hidden_states=torch.randn(1, PROMPT_TOKENS, cfg.caption_channels),
        timestep=t, sigma=t, encoder_attention_mask=torch.ones(1, PROMPT_TOKENS),
        audio_encoder_attention_mask=torch.ones(1, PROMPT_TOKENS), num_frames=f, height=h, width=w, fps=24.0,
        audio_num_frames=audio_tokens, use_cross_timestep=True, return_dict=False))


def main() -> None:
    from diffusers import LTX2VideoTransformer3DModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", nargs="+", default=["256x256x25", "256x384x25", "384x384x49"],
                        help="HEIGHTxWIDTHxFRAMES clips (sides multiples of 32, frames 1 + 8k)")
    args = parser.parse_args()
    model, depth = one_block_model(LTX2VideoTransformer3DModel)
    print(f"{'clip':>12}{'video':>7}{'audio':>7}{'MiB/block':>11}{'KiB/video token':>17}{f'GiB x{depth}':>9}")
    for spec in args.clips:
        height, width, frames = (int(x) for x in spec.split("x"))
        video, audio, _ = clip_tokens(height, width, frames)
        saved = saved_bytes(model, height, width, frames)
        print(f"{spec:>12}{video:>7}{audio:>7}{saved / 2**20:>11.1f}{saved / video / 2**10:>17.1f}"
              f"{depth * saved / 2**30:>9.2f}")


if __name__ == "__main__":
    main()
