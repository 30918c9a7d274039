"""Tiny random-weight Wan pipelines built from configs in code (a sentencepiece-style UMT5 tokenizer over ASCII
characters included) and saved in diffusers layout, so the adapters load them through ``from_pretrained`` like the
published checkpoints: Wan 2.1 text-to-video, Wan 2.2 A14B's two experts (UniPC with a flow shift and a boundary,
as published, or FlowMatchEuler), Wan 2.1 image-to-video with a CLIP image encoder, and a TI2V-5B-like pipeline
(48-channel residual VAE, per-token timesteps; 64 px). 32 x 32 px, 9 frames: 3 latent frames of 4 x 4."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SIZE, FRAMES, TEXT_DIM, IMAGE_DIM = 32, 9, 32, 16


def umt5_tokenizer(max_length: int = 512):
    """A unigram tokenizer over ASCII characters; ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2 as UMT5's."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    chars = string.ascii_letters + string.digits + string.punctuation
    pieces += [(c, -3.0) for c in chars] + [("\u2581" + c, -2.5) for c in chars]
    tokenizer = T5Tokenizer(vocab=pieces, extra_ids=0)
    tokenizer.model_max_length = max_length
    return tokenizer


def umt5(tokenizer):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=TEXT_DIM, d_kv=8, d_ff=37, num_layers=1,
                                       num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0,
                                       pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))


def vae(z_dim: int = 16):
    from diffusers import AutoencoderKLWan

    # 8x spatial, 4x temporal compression (two temporal downsamplings), as Wan 2.1's VAE
    return AutoencoderKLWan(base_dim=3, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True], latents_mean=[0.1 * i for i in range(z_dim)],
                            latents_std=[1.0 + 0.1 * i for i in range(z_dim)])


def transformer(in_channels: int = 16, out_channels: int = 16, image_dim=None):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                 in_channels=in_channels, out_channels=out_channels, text_dim=TEXT_DIM,
                                 freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                                 qk_norm="rms_norm_across_heads", rope_max_seq_len=32, image_dim=image_dim,
                                 added_kv_proj_dim=24 if image_dim else None)


def euler(shift: float = 3.0):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=shift)


def unipc(flow_shift: float = 12.0):
    """As the published Wan checkpoints: flow sigmas, flow prediction, integer timesteps."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=flow_shift, prediction_type="flow_prediction")


def text_components() -> dict:
    tokenizer = umt5_tokenizer()
    return {"tokenizer": tokenizer, "text_encoder": umt5(tokenizer), "vae": vae()}


def wan21(scheduler=None) -> dict:
    return {**text_components(), "transformer": transformer(), "scheduler": scheduler or euler()}


def wan22(scheduler=None, boundary_ratio: float = 0.875) -> dict:
    """Two experts switched at ``boundary_ratio`` (Wan2.2-T2V-A14B's 0.875)."""
    return {**text_components(), "transformer": transformer(), "transformer_2": transformer(),
            "scheduler": scheduler or unipc(), "boundary_ratio": boundary_ratio}


def wan21_i2v() -> dict:
    """Wan 2.1 I2V: the latents concatenated with 4 mask + 16 image-latent channels, and CLIP image tokens."""
    from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModel

    encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=IMAGE_DIM, intermediate_size=37, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=SIZE, patch_size=8))
    processor = CLIPImageProcessorPil(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE})
    return {**text_components(), "transformer": transformer(36, 16, IMAGE_DIM), "scheduler": euler(),
            "image_encoder": encoder, "image_processor": processor}


def wan22_i2v() -> dict:
    """Wan 2.2 I2V A14B: two experts (boundary 0.9 as published) on the 36 input channels, no image encoder."""
    return {**text_components(), "transformer": transformer(36, 16), "transformer_2": transformer(36, 16),
            "scheduler": euler(5.0), "boundary_ratio": 0.9}


def ti2v() -> dict:
    """Wan 2.2 TI2V-5B's shape: a 48-channel residual VAE over 2x2 pixel patches (16x spatial compression) and one
    timestep per token (``expand_timesteps``); 64 px."""
    from diffusers import AutoencoderKLWan

    vae48 = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                             temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                             out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                             latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
    return {**text_components(), "vae": vae48, "transformer": transformer(48, 48), "scheduler": euler(5.0),
            "expand_timesteps": True}


def save(pipeline_class, components: dict, out: Path, seed: int = 0) -> Path:
    """Builds ``components`` under ``seed`` (a callable) and writes them with the pipeline's ``save_pretrained``."""
    torch.manual_seed(seed)
    pipeline_class(**components()).save_pretrained(out)
    return out


def save_all(root: Path) -> dict[str, str]:
    """Every tiny Wan pipeline under ``root``: ``wan21``, ``wan22`` (UniPC), ``wan22_euler`` (the same weights with
    FlowMatchEuler, for ODE comparisons), ``wan21_i2v``, ``wan22_i2v``, ``ti2v``."""
    from diffusers import WanImageToVideoPipeline, WanPipeline

    paths = {"wan21": save(WanPipeline, wan21, root / "wan21"),
             "wan22": save(WanPipeline, wan22, root / "wan22", seed=1),
             "wan22_euler": save(WanPipeline, lambda: wan22(euler(5.0)), root / "wan22_euler", seed=1),
             "wan21_i2v": save(WanImageToVideoPipeline, wan21_i2v, root / "wan21_i2v", seed=2),
             "wan22_i2v": save(WanImageToVideoPipeline, wan22_i2v, root / "wan22_i2v", seed=4),
             "ti2v": save(WanPipeline, ti2v, root / "ti2v", seed=3)}
    return {name: str(path) for name, path in paths.items()}
