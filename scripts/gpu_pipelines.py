"""The pipelines ``scripts/bench_gpu.py`` trains: each family's published transformer at full size (random weights,
built in bf16 on the GPU from ``scripts/count_parameters.py``'s configs) with stand-ins for what does not set the
cost of a training step: a text encoder as shallow as the pipeline allows but with the published output width (so
the transformer's text projection and its text tokens are the real ones), a small VAE with the published latent
channels and compression (8x in space, 4x in time for Wan), and the tests' offline tokenizers. ``tiny=True`` returns
the tests' tiny pipelines instead (``tests/policies/tiny_families.py``, ``tiny_wan.py``): the same code path, CPU
sized; ``layers`` caps the transformer's depth (full width), for a smoke run of the full-size wiring.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from scripts.count_parameters import TRANSFORMERS, build_transformer


#: the config keys of a transformer's depth, which ``layers`` caps (a smoke run of the full-width wiring)
DEPTH = ("num_layers", "num_single_layers", "n_layers", "n_refiner_layers")


def _full_transformer(name: str, layers: Optional[int] = None):
    depth = {k: min(v, layers) for k, v in TRANSFORMERS[name][1].items() if k in DEPTH and layers is not None}
    # a 20B transformer initialises in seconds on a GPU and in minutes on a CPU; bf16 halves what is written to disk
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        return build_transformer(name, **depth).to(torch.bfloat16)


def qwen_image(tiny: bool = False, layers: Optional[int] = None) -> dict:
    """Qwen-Image: the 60-block, 20.4B transformer; the tests' two-layer Qwen2.5-VL with hidden states 3584 wide (28
    heads of 128, as Qwen2.5-VL-7B), the 8x Qwen-Image VAE of 16 channels."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler
    from transformers import Qwen2_5_VLForConditionalGeneration

    from tests.policies.tiny_families import qwen_image_components

    components = qwen_image_components()
    if tiny:
        return components
    config = copy.deepcopy(components["text_encoder"].config)
    text = config.text_config
    text.hidden_size, text.num_attention_heads, text.num_key_value_heads = 3584, 28, 4
    text.rope_parameters["mrope_section"] = [16, 24, 24]  # Qwen2.5-VL-7B's, for heads of 128
    config.vision_config.out_hidden_size = config.hidden_size = 3584
    scheduler = dict(components["scheduler"].config)
    # the tests' grid is sized for 16 tokens; 1,024 tokens get a moderate shift here (the grid does not change the cost)
    scheduler.update(base_image_seq_len=256, max_image_seq_len=8192)
    return {**components, "transformer": _full_transformer("qwen_image", layers),
            "text_encoder": Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16),
            "vae": AutoencoderKLQwenImage(base_dim=4, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                          temperal_downsample=[False, True, True]),
            "scheduler": FlowMatchEulerDiscreteScheduler.from_config(scheduler)}


def flux2_klein_4b(tiny: bool = False, layers: Optional[int] = None) -> dict:
    """FLUX.2 [klein] 4B base (CFG): the 5 double + 20 single block, 3.9B transformer; a Qwen3 of 2560-wide hidden
    states (Qwen3-4B's width) with the 27 layers the pipeline's ``text_encoder_out_layers=(9, 18, 27)`` reads, each
    2 heads of 8 and an MLP of 16; the 8x FLUX.2 VAE of 32 channels (128 after its 2x2 patches)."""
    from diffusers import AutoencoderKLFlux2
    from transformers import Qwen3ForCausalLM

    from tests.policies.tiny_families import flux2_klein_components

    components = flux2_klein_components()
    if tiny:
        return components
    config = copy.deepcopy(components["text_encoder"].config)
    config.hidden_size = 2560
    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                             up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8,) * 4,
                             layers_per_block=1, latent_channels=32, norm_num_groups=4, sample_size=512,
                             use_quant_conv=False, use_post_quant_conv=False)
    return {**components, "transformer": _full_transformer("flux2_klein_4b", layers),
            "text_encoder": Qwen3ForCausalLM(config).to(torch.bfloat16), "vae": vae}


def wan21_1b3(tiny: bool = False, layers: Optional[int] = None) -> dict:
    """Wan 2.1 T2V 1.3B: the 30-block, 1.42B transformer; a one-layer UMT5 of 4096-wide states (UMT5-XXL's width)
    and the tests' Wan VAE (16 channels, 8x in space, 4x in time)."""
    from transformers import UMT5Config, UMT5EncoderModel

    from tests.policies.tiny_wan import wan21

    components = wan21()
    if tiny:
        return components
    config = UMT5Config(vocab_size=len(components["tokenizer"]), d_model=4096, d_kv=8, d_ff=37, num_layers=1,
                        num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=0,
                        eos_token_id=1, decoder_start_token_id=0)
    return {**components, "transformer": _full_transformer("wan21_1b3", layers),
            "text_encoder": UMT5EncoderModel(config)}
