"""Tiny random-weight editing pipelines (Qwen-Image-Edit and Edit-Plus, FLUX.1 Kontext), built from configs with
offline tokenizers and processors and saved with ``save_pretrained``, so the adapters load them through the same code
path as the published ones.

Qwen-Image-Edit's prompt encoder is Qwen2.5-VL *with* its vision tower: the source images become image tokens of the
prompt. Its processor (``Qwen2VLProcessor``) also holds a video processor, which transformers builds only with
torchvision (absent here); :class:`TinyVLProcessor` is that processor without its video half: the same
``Qwen2VLProcessor.__call__`` on the PIL-backed ``Qwen2VLImageProcessorPil``. The pipelines' ``model_index.json``
names it, and the adapter loads whatever class the index names, as diffusers does.

The tokenizer is trained on the edit templates (both tokenize their system prefix to the 64 tokens the pipelines
drop, as the real one). Sizes: output images 32 px; source images reach the VAE at ``SOURCE_AREA`` (the pipelines'
1024 x 1024, patched in the tests) and the vision tower at ``CONDITION_AREA`` (Edit-Plus's 384 x 384).
"""

from __future__ import annotations

import inspect
import re

import torch
from transformers import Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

from tests.policies.qwen_tokenizers import IM_TOKENS, VISION_TOKENS, WORDS, qwen_tokenizer
from tests.policies.tiny_families import _token_ids

SOURCE_AREA = 32 * 32  # VAE source images: 32 x 32 px for a square image (8 x 8 latents, 16 packed tokens)
CONDITION_AREA = 56 * 56  # the vision tower's images: 56 x 56 px = 4 x 4 patches = 4 merged image tokens
EDIT_DROP = 64  # prompt_template_encode_start_idx of both edit pipelines


def _template(pipeline_class) -> str:
    """The pipeline's own prompt template, read from its ``__init__`` (it is not a config value)."""
    source = inspect.getsource(pipeline_class.__init__)
    return re.search(r'self.prompt_template_encode = "(.*)"\n', source).group(1).encode().decode("unicode_escape")


class TinyVLProcessor(Qwen2VLProcessor):
    """``Qwen2VLProcessor`` without its video processor (transformers builds that only with torchvision); images and
    text go through ``Qwen2VLProcessor.__call__`` unchanged."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def edit_tokenizer():
    """Qwen2.5-VL's tokenizer as both edit pipelines use it (each template's prefix is 64 tokens)."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    templates = [_template(QwenImageEditPlusPipeline), _template(QwenImageEditPipeline)]
    corpus = [t.replace("{}", "") for t in templates] * 50 + [WORDS, "make the cat blue, remove the tree"] * 20
    tokenizer = qwen_tokenizer(corpus, IM_TOKENS + VISION_TOKENS, vocab_size=640)
    for template in templates:
        prefix = template.split("{}")[0].replace("<|vision_start|><|image_pad|><|vision_end|>", "")
        if (count := len(tokenizer(prefix).input_ids)) != EDIT_DROP:
            raise AssertionError(f"the edit template's prefix is {count} tokens; the pipelines drop {EDIT_DROP}")
    return tokenizer


def qwen_image_edit_components(zero_cond_t: bool = False) -> dict:
    """Qwen-Image-Edit(-Plus): Qwen-Image's tiny MMDiT, VAE and scheduler, a Qwen2.5-VL whose one-layer vision tower
    reads 14 px patches merged 2 x 2, and its processor. ``zero_cond_t``: Qwen-Image-Edit-2511's transformer (the
    source tokens see timestep 0)."""
    from diffusers import QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tests.policies.tiny_families import qwen_image_components

    tokenizer = edit_tokenizer()
    ids = _token_ids(tokenizer, IM_TOKENS + VISION_TOKENS + ["<|endoftext|>"])
    text = {"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "rope_theta": 1e6,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"]}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
              "fullatt_block_indexes": [0], "window_size": 56}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, hidden_size=16, vocab_size=len(tokenizer),
                              vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                              vision_token_id=ids["<|video_pad|>"], image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"])
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=CONDITION_AREA * 4, patch_size=14, merge_size=2,
                                      temporal_patch_size=2)
    base = qwen_image_components()
    return {**base, "tokenizer": tokenizer, "text_encoder": Qwen2_5_VLForConditionalGeneration(config),
            "processor": TinyVLProcessor(image_processor=images, tokenizer=tokenizer),
            "transformer": QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                                       attention_head_dim=16, num_attention_heads=2,
                                                       joint_attention_dim=16, axes_dims_rope=(8, 4, 4),
                                                       zero_cond_t=zero_cond_t)}


def flux_kontext_components() -> dict:
    """FLUX.1 Kontext: the tiny FLUX.1 pipeline's components (guidance-embedded transformer, CLIP + T5, a VAE of
    factor 2 with FLUX's scaling and shift) and no IP-adapter image encoder."""
    from tests.policies.tiny_pipelines import flux_components

    return {**flux_components(), "image_encoder": None, "feature_extractor": None}


def source_images(count: int, size=(3, 40, 48), seed: int = 0) -> list[torch.Tensor]:
    """``count`` 8-bit images ``[3, H, W]`` in ``[0, 1]`` of another size than the output (the pipelines resize)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, size, generator=gen).float() / 255 for _ in range(count)]
