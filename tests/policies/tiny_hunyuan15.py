"""Tiny random-weight HunyuanVideo 1.5 pipelines (``HunyuanVideo15Pipeline`` and
``HunyuanVideo15ImageToVideoPipeline``) built from configs in code, tokenizers included, and saved with
``save_pretrained``, so the policies load them through ``from_pretrained`` like the published folders.

What the pipelines read and the tiny ones keep: the prompt template's system prefix is dropped by index
(``prompt_template_encode_start_idx`` = 108, hard-coded in the pipeline), so the Qwen tokenizer is trained until that
prefix is exactly 108 tokens (otherwise the crop would cut the prompt itself); the prompt embeddings are the
third-last hidden states, so the Qwen2.5-VL text model has 3 layers (with 2 they would be the token embeddings);
ByT5 (the glyph encoder) reads quoted text only, through a real ``ByT5Tokenizer`` (bytes: no files) and a small
``T5EncoderModel``. The VAE compresses 4x in space and 2x in time (the diffusers tests' tiny shape), the transformer's
``target_size`` is 16 px, whose size buckets include 12 x 16 (the size the tests use: 3 x 4 latents); the
image-to-video folder adds a SigLIP vision tower of the transformer's ``image_embed_dim``.
"""

from __future__ import annotations

import inspect

from diffusers import HunyuanVideo15Pipeline

from tests.policies.qwen_tokenizers import IM_TOKENS, VISION_TOKENS, WORDS, qwen_tokenizer
from tests.policies.tiny_families import _token_ids

LATENT, TEXT_DIM, GLYPH_DIM, IMAGE_DIM = 4, 16, 32, 12
HEIGHT, WIDTH, FRAMES = 12, 16, 5  # a bucket of target_size 16; 3 latent frames of 3 x 4
#: the prompt lengths the tests run at (the published 1000 Qwen and 256 ByT5 tokens would be padding on every call)
SHORT_TEXT = {"max_sequence_length": 32, "glyph_max_sequence_length": 32}
#: the system prefix HunyuanVideo15Pipeline drops, and the message it is built from (the function's own default)
DROP = 108
SYSTEM = inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters["system_message"].default


def short_text(pipe):
    """``pipe`` encoding prompts at the tests' lengths (:data:`SHORT_TEXT`; the pipeline reads them from attributes)."""
    pipe.tokenizer_max_length = SHORT_TEXT["max_sequence_length"]
    pipe.tokenizer_2_max_length = SHORT_TEXT["glyph_max_sequence_length"]
    return pipe


def hunyuan_tokenizer():
    """Qwen2.5-VL's tokenizer as ``HunyuanVideo15Pipeline`` uses it: the smallest trained vocabulary whose template
    prefix (system turn and user header) is at most 108 tokens, which must then be exactly 108."""
    prefix = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    turn = prefix + f"{WORDS}<|im_end|>\n<|im_start|>assistant\n"
    for vocab_size in range(480, 640, 4):
        tokenizer = qwen_tokenizer([turn] + [WORDS] * 10, IM_TOKENS + VISION_TOKENS, vocab_size=vocab_size)
        count = len(tokenizer(prefix).input_ids)
        if count <= DROP:
            break
    if count != DROP:
        raise AssertionError(f"the template prefix is {count} tokens; HunyuanVideo15Pipeline drops {DROP}")
    return tokenizer


def text_components() -> dict:
    """Qwen2.5-VL (3 layers), ByT5 (a 1-layer T5 encoder over bytes), the 4x VAE, the scheduler and the guider."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    tokenizer = hunyuan_tokenizer()
    ids = _token_ids(tokenizer, ["<|endoftext|>", "<|im_end|>"])
    qwen = Qwen2_5_VLTextConfig(vocab_size=len(tokenizer), hidden_size=TEXT_DIM, intermediate_size=16,
                                num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                                rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                 "mrope_section": [1, 1, 2]},
                                pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
                                eos_token_id=ids["<|im_end|>"])
    byt5 = ByT5Tokenizer()
    t5 = T5Config(vocab_size=len(byt5), d_model=GLYPH_DIM, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                  relative_attention_num_buckets=8, dropout_rate=0.0, feed_forward_proj="gated-gelu")
    vae = AutoencoderKLHunyuanVideo15(latent_channels=LATENT, block_out_channels=(16, 16), layers_per_block=1,
                                      spatial_compression_ratio=4, temporal_compression_ratio=2,
                                      downsample_match_channel=False, upsample_match_channel=False)
    return {"text_encoder": Qwen2_5_VLTextModel(qwen).eval(), "tokenizer": tokenizer,
            "text_encoder_2": T5EncoderModel(t5).eval(), "tokenizer_2": byt5, "vae": vae.eval(),
            # the published 480p folders: shift 5, CFG 6
            "scheduler": FlowMatchEulerDiscreteScheduler(shift=5.0), "guider": ClassifierFreeGuidance(6.0)}


def transformer(task_type: str = "t2v"):
    from diffusers import HunyuanVideo15Transformer3DModel

    return HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT + 1, out_channels=LATENT, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=TEXT_DIM,
        text_embed_2_dim=GLYPH_DIM, image_embed_dim=IMAGE_DIM, rope_axes_dim=(2, 2, 4), target_size=16,
        task_type=task_type).eval()


def hunyuan15_t2v() -> dict:
    return {**text_components(), "transformer": transformer()}


def hunyuan15_i2v() -> dict:
    """Image-to-video: the same text side, and a SigLIP tower (16 px, 8 px patches: 4 image tokens)."""
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    tower = SiglipVisionModel(SiglipVisionConfig(hidden_size=IMAGE_DIM, intermediate_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=16, patch_size=8))
    return {**text_components(), "transformer": transformer("i2v"), "image_encoder": tower.eval(),
            "feature_extractor": SiglipImageProcessorPil(size={"height": 16, "width": 16})}
