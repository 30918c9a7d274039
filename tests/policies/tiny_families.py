"""Tiny random-weight Qwen-Image, FLUX.2 ([klein] and [dev]) and Z-Image pipelines (32 px images), built from
configs with offline tokenizers (``qwen_tokenizers``) and saved with ``save_pretrained``, so the adapters load them
through ``from_pretrained`` like the published ones (as diffusers' ``get_dummy_components``).

Where a published model normalises its latents (Qwen-Image's ``latents_mean``/``latents_std``, FLUX.2's batch-norm
running statistics, Z-Image's scaling and shift factors) the tiny one gets values far from the identity, so a
decode that skips or inverts them fails the tests; the schedulers use the features of the published configs
(dynamic shifting, a terminal sigma, a static shift) at token counts that fit 32 px images.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.policies.qwen_tokenizers import (IM_TOKENS, VISION_TOKENS, WORDS, qwen3_tokenizer, qwen_image_tokenizer,
                                           qwen_tokenizer)

IMAGE_SIZE = 32
# copied from QwenImagePipeline.__init__ (diffusers 0.42.1): the tokenizer is trained on it so that its prefix is the
# 34 tokens the pipeline drops (test_qwen_image compares the encodings with the pipeline's)
QWEN_IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n")
QWEN_IMAGE_DROP = 34


def _token_ids(tokenizer, names) -> dict[str, int]:
    return {name: tokenizer.convert_tokens_to_ids(name) for name in names}


def qwen_image_components() -> dict:
    """Qwen-Image: a 2-block MMDiT on 2x2-packed latents, Qwen2.5-VL text encoder, the 3D causal VAE (factor 4)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen_image_tokenizer(QWEN_IMAGE_TEMPLATE, QWEN_IMAGE_DROP)
    ids = _token_ids(tokenizer, IM_TOKENS + VISION_TOKENS + ["<|endoftext|>"])
    text = {"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "rope_theta": 1e6,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"]}
    config = Qwen2_5_VLConfig(
        text_config=text, hidden_size=16, vocab_size=len(tokenizer),
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        vision_token_id=ids["<|video_pad|>"], image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"])
    z_dim = 4
    return {
        # in_channels = 4 VAE channels x a 2x2 patch; axes_dims_rope sums to the head dim
        "transformer": QwenImageTransformer2DModel(patch_size=2, in_channels=4 * z_dim, out_channels=z_dim,
                                                   num_layers=2, attention_head_dim=16, num_attention_heads=2,
                                                   joint_attention_dim=16, axes_dims_rope=(8, 4, 4)),
        "vae": AutoencoderKLQwenImage(base_dim=12, z_dim=z_dim, dim_mult=[1, 2, 4], num_res_blocks=1,
                                      temperal_downsample=[False, True], latents_mean=[0.3, -0.2, 0.5, -0.4],
                                      latents_std=[2.0, 0.5, 1.5, 3.0]),
        # Qwen-Image's scheduler features: the exponential dynamic shift and a terminal sigma of 0.02
        "scheduler": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential",
                                                     base_shift=0.5, max_shift=0.9, base_image_seq_len=4,
                                                     max_image_seq_len=64, shift_terminal=0.02),
        "tokenizer": tokenizer,
        "text_encoder": Qwen2_5_VLForConditionalGeneration(config),
    }


def _qwen3_config(tokenizer, layers: int):
    from transformers import Qwen3Config

    ids = _token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>"])
    return Qwen3Config(hidden_size=16, intermediate_size=16, num_hidden_layers=layers, num_attention_heads=2,
                       num_key_value_heads=2, head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=512,
                       tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                       pad_token_id=ids["<|endoftext|>"])


def flux2_klein_components() -> dict:
    """FLUX.2 [klein]: one double and one single block on patchified latents (4 VAE channels x 2x2 = 16), a Qwen3
    text encoder with 27 layers so that the pipeline's default ``text_encoder_out_layers=(9, 18, 27)`` exists
    (prompt embeddings: 3 layers x 16 = 48 = ``joint_attention_dim``), and a 2-block VAE (factor 2)."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
    from transformers import Qwen3ForCausalLM

    tokenizer = qwen3_tokenizer()
    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                             latent_channels=4, norm_num_groups=4, sample_size=IMAGE_SIZE, use_quant_conv=False,
                             use_post_quant_conv=False)
    with torch.no_grad():  # the batch-norm statistics the pipeline un-normalises patchified latents with
        vae.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 16))
        vae.bn.running_var.copy_(torch.linspace(0.25, 4.0, 16))
    return {
        "transformer": Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=48,
                                               timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
                                               guidance_embeds=False),
        "vae": vae,
        # FLUX.2's scheduler: the exponential dynamic shift (mu: the pipeline's compute_empirical_mu)
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True,
                                                     time_shift_type="exponential"),
        "tokenizer": tokenizer,
        "text_encoder": Qwen3ForCausalLM(_qwen3_config(tokenizer, 27)),
    }


MISTRAL_SPECIAL = ["[IMG]", "[IMG_BREAK]", "[IMG_END]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]"]
# Mistral's chat format for the role/content-list messages of Flux2Pipeline (system message, then the prompt)
MISTRAL_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}[SYSTEM_PROMPT]"
    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}[/SYSTEM_PROMPT]"
    "{% else %}[INST]{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}[IMG]{% endif %}{% endfor %}[/INST]{% endif %}{% endfor %}")


def flux2_dev_components() -> dict:
    """FLUX.2 [dev] (``Flux2Pipeline``): the [klein] VAE and scheduler, a transformer with the guidance embedding, and
    a Mistral3 text encoder with 30 layers so that the pipeline's ``text_encoder_out_layers=(10, 20, 30)`` exists.
    The published model's tokenizer is a ``PixtralProcessor``, which needs torchvision; a plain tokenizer with
    Mistral's chat format serves ``Flux2Pipeline.encode_prompt`` the same way (``AutoProcessor`` loads either)."""
    from diffusers import Flux2Transformer2DModel
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tokenizer = qwen_tokenizer([SYSTEM_MESSAGE] * 50 + [WORDS] * 20, MISTRAL_SPECIAL)
    tokenizer.chat_template = MISTRAL_TEMPLATE
    ids = _token_ids(tokenizer, ["<|endoftext|>", "[IMG]"])
    text = {"model_type": "mistral", "vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 16,
            "num_hidden_layers": 30, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 512, "pad_token_id": ids["<|endoftext|>"]}
    vision = {"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "head_dim": 8, "image_size": 32, "patch_size": 16}
    config = Mistral3Config(text_config=text, vision_config=vision, image_token_index=ids["[IMG]"],
                            spatial_merge_size=1, vision_feature_layer=-1)
    return {**flux2_klein_components(), "tokenizer": tokenizer,
            "text_encoder": Mistral3ForConditionalGeneration(config),
            "transformer": Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=48,
                                                   timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
                                                   guidance_embeds=True)}


def zimage_transformer(dim: int = 32):
    """Z-Image's DiT (4 latent channels, 2x2 patches, 16-wide captions): one refiner layer per stream, 2 main layers
    of width ``dim`` (2 heads; the RoPE axes split the head width 2:1:1)."""
    from diffusers import ZImageTransformer2DModel

    head = dim // 2
    transformer = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=dim,
                                           n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=16,
                                           axes_dims=[head // 2, head // 4, head // 4], axes_lens=[256, 32, 32])
    with torch.no_grad():  # the pad tokens are allocated with torch.empty; give them values (as diffusers' tests do)
        transformer.x_pad_token.copy_(torch.full_like(transformer.x_pad_token, 0.5))
        transformer.cap_pad_token.copy_(torch.full_like(transformer.cap_pad_token, -0.5))
    return transformer


def zimage_components() -> dict:
    """Z-Image: a single-stream DiT (one refiner layer per stream, 2 main layers) that patchifies 4-channel latents
    itself, a Qwen3 text encoder (its second-to-last hidden states), an ``AutoencoderKL`` with Z-Image's factors."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
    from transformers import Qwen3Model

    tokenizer = qwen3_tokenizer()
    return {
        "transformer": zimage_transformer(),
        "vae": AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                             latent_channels=4, norm_num_groups=4, sample_size=IMAGE_SIZE, scaling_factor=0.3611,
                             shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),  # Z-Image-Turbo's static shift
        "tokenizer": tokenizer,
        "text_encoder": Qwen3Model(_qwen3_config(tokenizer, 2)),
    }


def set_distilled(folder: Path, out: Path, distilled: bool) -> Path:
    """A copy of a ``Flux2KleinPipeline`` folder whose ``model_index.json`` says ``is_distilled`` (the 4-step klein
    models) or not (the klein base models, sampled with CFG)."""
    shutil.copytree(folder, out)
    index = json.loads((out / "model_index.json").read_text())
    (out / "model_index.json").write_text(json.dumps({**index, "is_distilled": distilled}))
    return out
