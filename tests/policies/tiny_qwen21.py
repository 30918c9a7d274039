"""A tiny random-weight Qwen-Image 2.1 pipeline (``QwenImage21Pipeline``), built from configs with an offline Qwen3-VL
tokenizer and processor and saved with ``save_pretrained``, so :class:`~flowrl.policies.QwenImage21Policy` loads it
through ``from_pretrained`` like the published folder.

What the pipeline reads and the tiny one keeps: the system prefix it drops is counted with the *processor's* chat
template on a content list (``[{"type": "text", ...}]``), so the template below renders content lists as Qwen3-VL's
does; the VAE really downsamples 16x (the pipeline hard-codes ``vae_scale_factor = 16``: four spatial halvings), has
the published 4-channel (RGBA) input and output and 8 latent channels normalised far from the identity; the
transformer keeps ``causal_condition`` (text tokens modulated from t = 0) and the 3-axis RoPE. Qwen3-VL's processor
also holds a video processor, which transformers builds only with torchvision (absent here):
:class:`TinyQwen3VLProcessor` is that processor without its video half, as ``tiny_editing.TinyVLProcessor`` is for
Qwen2-VL.
"""

from __future__ import annotations

from transformers import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin

from tests.policies.qwen_tokenizers import IM_TOKENS, VISION_TOKENS, WORDS, qwen_tokenizer
from tests.policies.tiny_families import _token_ids

Z_DIM = 8
#: Qwen3-VL's rendering of role/content messages whose content is a string or a list of typed parts
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class TinyQwen3VLProcessor(Qwen3VLProcessor):
    """``Qwen3VLProcessor`` without its video processor; text (and images) go through ``Qwen3VLProcessor.__call__``
    unchanged."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        for name in ("image", "video", "vision_start", "vision_end"):
            token = {"image": "<|image_pad|>", "video": "<|video_pad|>"}.get(name, f"<|{name}|>")
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def qwen21_processor() -> TinyQwen3VLProcessor:
    """The tokenizer trained on the pipeline's text-to-image template, in a processor whose images are 16 px patches
    merged 2 x 2 (Qwen3-VL's)."""
    from diffusers import QwenImage21Pipeline
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    template = QwenImage21Pipeline.__init__.__code__.co_consts  # the template is built in __init__, not a config
    system = next(c for c in template if isinstance(c, str) and c.startswith("Comprehend"))
    turn = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{WORDS}<|im_end|>\n<|im_start|>assistant\n"
    tokenizer = qwen_tokenizer([turn] * 30, IM_TOKENS + VISION_TOKENS)
    images = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32,
                                      max_pixels=64 * 64)
    return TinyQwen3VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def qwen_image21_components() -> dict:
    """Qwen-Image 2.1: a 2-block single-stream transformer on unpatched 8-channel latents, a 2-layer Qwen3-VL, the
    16x VAE, and the dynamic-shift scheduler with a terminal sigma at 32-64 px token counts."""
    from diffusers import AutoencoderKLQwenImage21, FlowMatchEulerDiscreteScheduler, QwenImage21Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    processor = qwen21_processor()
    tokenizer = processor.tokenizer
    ids = _token_ids(tokenizer, IM_TOKENS + VISION_TOKENS + ["<|endoftext|>"])
    text = {"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [1, 1, 2],
                                "mrope_interleaved": True},
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"]}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
              "patch_size": 16, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"])
    return {
        # axes_dims_rope sums to the head dim; context_in_dim is the text encoder's width
        "transformer": QwenImage21Transformer2DModel(in_channels=Z_DIM, out_channels=Z_DIM, num_layers=2,
                                                     attention_head_dim=16, num_attention_heads=2, context_in_dim=16,
                                                     mlp_ratio=2, axes_dims_rope=(4, 6, 6)),
        "vae": AutoencoderKLQwenImage21(base_dim=8, decoder_base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1, 1],
                                        num_res_blocks=1, temperal_downsample=[False] * 4,
                                        latents_mean=[0.3, -0.2, 0.5, -0.4, 0.1, 0.6, -0.7, 0.2],
                                        latents_std=[2.0, 0.5, 1.5, 3.0, 0.8, 2.5, 1.2, 0.6]),
        "scheduler": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                     base_image_seq_len=4, max_image_seq_len=16, shift_terminal=0.02),
        "text_encoder": Qwen3VLForConditionalGeneration(config),
        "processor": processor,
    }
