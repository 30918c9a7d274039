"""A tiny random-weight LTX-2 pipeline (``LTX2Pipeline``; ``LTX2ImageToVideoPipeline`` reads the same folder), built
from configs in code and saved with ``save_pretrained``, so :class:`~flowrl.policies.LTX2Policy` loads it through
``from_pretrained`` like ``Lightricks/LTX-2``.

The shapes follow diffusers' own ``tests/pipelines/ltx2/test_ltx2.py::get_dummy_components`` (a 2-block joint
audio-video transformer, 1-layer connectors, a VAE that halves space and time, an 8-mel audio VAE and a vocoder), with
two things built here instead of downloaded: a character-level ``GemmaTokenizer`` (``<pad>`` 0, ``<eos>`` 1,
``<bos>`` 2) and a 2-layer ``Gemma3ForConditionalGeneration`` (its SigLIP tower one tiny layer, unused by text). The
VAEs' ``latents_mean`` / ``latents_std`` buffers are set far from the identity so that a missed (de)normalisation
shows, and the scheduler is the published one (dynamic shift, terminal sigma 0.1) with token bounds scaled to the
tiny video's 3 x 16 x 16 = 768 tokens.
"""

from __future__ import annotations

import string

import torch

#: the tiny video: 32 x 32 px (the pipeline's multiple of 32), 5 frames at 30 fps -> 3 latent frames of 16 x 16
#: (4 channels); audio: round(5 / 30 s x 25 latent frames / s) = 4 latent frames of 2 channels x 2 mel bins. The joint
#: state, 3 x 16 x 16 x 4 + 4 x 4 = 3088 values, is a multiple of 16, as every real model's (128 channels): the
#: sampler's per-step noise draws equal one draw of all steps only then (flowrl.sampling.sampler.NoiseStream)
HEIGHT = WIDTH = 32
FRAMES, FRAME_RATE = 5, 30.0
TEXT_LAYERS, TEXT_DIM = 2, 32


def gemma_tokenizer():
    """A character-level Gemma tokenizer (BPE without merges over printable ASCII)."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    chars = [c for c in string.printable if not c.isspace()] + ["\u2581"]
    vocab = {token: i for i, token in enumerate(specials + chars)}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[])
    tokenizer.model_max_length = 1024
    return tokenizer


def gemma3(tokenizer):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {"vocab_size": len(tokenizer), "hidden_size": TEXT_DIM, "intermediate_size": 32,
            "num_hidden_layers": TEXT_LAYERS, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "sliding_window": 8, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    vision = {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 8}
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=3)
    return Gemma3ForConditionalGeneration(config).eval()


def transformer(num_layers: int = 2):
    """The joint transformer: a video stream of 2 x 8 head dims and an audio stream of 2 x 4 over 4-channel tokens."""
    from diffusers import LTX2VideoTransformer3DModel

    return LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=num_layers,
        qk_norm="rms_norm_across_heads", caption_channels=TEXT_DIM, rope_double_precision=False, rope_type="split")


def ltx2_components() -> dict:
    """Every component of ``LTX2Pipeline`` (see the module doc)."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    tokenizer = gemma_tokenizer()
    connectors = LTX2TextConnectors(
        caption_channels=TEXT_DIM, text_proj_in_factor=TEXT_LAYERS + 1, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
        rope_double_precision=False, causal_temporal_positioning=False, rope_type="split")
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    vae.latents_mean.copy_(torch.tensor([0.3, -0.2, 0.5, -0.4]))
    vae.latents_std.copy_(torch.tensor([2.0, 0.5, 1.5, 3.0]))
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8)
    audio_vae.latents_mean.copy_(torch.tensor([0.1, -0.3, 0.2, 0.4]))
    audio_vae.latents_std.copy_(torch.tensor([1.5, 0.7, 2.5, 1.2]))
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins, hidden_channels=32, out_channels=2,
        upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                base_image_seq_len=256, max_image_seq_len=1024, shift_terminal=0.1)
    return {"transformer": transformer(), "vae": vae, "audio_vae": audio_vae, "scheduler": scheduler,
            "text_encoder": gemma3(tokenizer), "tokenizer": tokenizer, "connectors": connectors, "vocoder": vocoder}
