"""Tiny random-weight SD3 and FLUX.1 pipelines (32 px images, one-layer transformers), built from configs with
offline tokenizers and saved in diffusers layout, so the adapters load them through ``from_pretrained`` like the
published ones (as diffusers' own ``get_dummy_components``)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, PreTrainedTokenizerFast,
                          T5Config, T5EncoderModel)

from tests.rewards.tiny_clip import tiny_tokenizer

IMAGE_SIZE = 32
CLIP_LENGTH = 16
WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "photo", "of", "green", "tree"]


def clip_tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.model_max_length = CLIP_LENGTH
    return tokenizer


def t5_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level stand-in for T5's sentencepiece tokenizer (same special tokens)."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=512)


def clip_config(tokenizer, hidden: int, projection: int = 16) -> CLIPTextConfig:
    return CLIPTextConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, intermediate_size=37,
                          num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=CLIP_LENGTH,
                          projection_dim=projection, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def t5_encoder(d_model: int = 32) -> T5EncoderModel:
    return T5EncoderModel(T5Config(vocab_size=len(WORDS), d_model=d_model, d_kv=8, d_ff=37, num_layers=1,
                                   num_heads=2, decoder_start_token_id=0))


def vae(latent_channels: int, shift: float, scale: float):
    from diffusers import AutoencoderKL

    # two blocks: 2x downsampling, so 32 px images have 16x16 latents
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels, block_out_channels=(8, 8),
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         layers_per_block=1, norm_num_groups=4, sample_size=IMAGE_SIZE, shift_factor=shift,
                         scaling_factor=scale, use_quant_conv=False, use_post_quant_conv=False)


def sd3_components() -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    tokenizer = clip_tokenizer()
    # CLIP hidden states (16 + 16) are padded to the T5 width (32): joint_attention_dim = 32
    return {
        "transformer": SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, out_channels=4,
                                             num_layers=1, attention_head_dim=8, num_attention_heads=2,
                                             joint_attention_dim=32, caption_projection_dim=16,
                                             pooled_projection_dim=32, pos_embed_max_size=16),
        "vae": vae(4, shift=0.0609, scale=1.5035),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
        "tokenizer": tokenizer, "tokenizer_2": clip_tokenizer(), "tokenizer_3": t5_tokenizer(),
        "text_encoder": CLIPTextModelWithProjection(clip_config(tokenizer, 16)),
        "text_encoder_2": CLIPTextModelWithProjection(clip_config(tokenizer, 16)),
        "text_encoder_3": t5_encoder(),
    }


def flux_components() -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    tokenizer = clip_tokenizer()
    return {
        # in_channels = 4 latent channels x a 2x2 patch; axes_dims_rope sums to the head dim
        "transformer": FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                              attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                              pooled_projection_dim=16, guidance_embeds=True,
                                              axes_dims_rope=(4, 2, 2)),
        "vae": vae(4, shift=0.1159, scale=0.3611),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                     max_shift=1.15, base_image_seq_len=16, max_image_seq_len=256),
        "tokenizer": tokenizer, "tokenizer_2": t5_tokenizer(),
        "text_encoder": CLIPTextModel(clip_config(tokenizer, 16)),
        "text_encoder_2": t5_encoder(),
    }


def save_pipeline(pipeline_class, build, out: Path, seed: int = 0) -> Path:
    """Builds the components (``build()``) from ``seed`` and writes them with the pipeline's own
    ``save_pretrained`` (model_index.json included)."""
    torch.manual_seed(seed)
    pipeline_class(**build()).save_pretrained(out)
    return out
