"""Tiny random-weight stand-ins for the learned video judges, built in code and saved as their published folders are
laid out: a Qwen2-VL base + a VideoAlign checkpoint folder (``model_config.json``, ``checkpoint-<step>/model.pth``
in the authors' transformers-4.45 key layout, or a LoRA adapter with ``non_lora_state_dict.pth``), and a
Qwen2.5-VL folder for VideoScore2. One-layer towers, 16-wide, 14 px patches merged 2 x 2: a 4-frame 28 x 56 clip is
2 x 2 x 4 patches, 4 video tokens."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.policies.qwen_tokenizers import IM_TOKENS, VISION_TOKENS, WORDS, qwen_tokenizer

# Qwen2-VL's chat format for content lists (a video item becomes the vision block), as its chat template renders it
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MIN_PIXELS, MAX_PIXELS = 28 * 28, 56 * 56  # frames of 28-56 px stay as they are (multiples of 28)


def _tokenizer(corpus: list[str]):
    # up to 2,000 pieces: VideoAlign's 588-word rubric is 818 tokens (1,392 at 600): the judge's cost here
    tokenizer = qwen_tokenizer(corpus + [WORDS] * 5, IM_TOKENS + VISION_TOKENS, vocab_size=2000)
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    return tokenizer


def _configs(tokenizer, vision: dict) -> dict:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in IM_TOKENS + VISION_TOKENS + ["<|endoftext|>"]}
    text = {"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "rope_theta": 1e6,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"]}
    return dict(text_config=text, vision_config=vision, vocab_size=len(tokenizer),
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"])


def _save_processor(folder: Path, tokenizer) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.save_pretrained(folder)
    Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=14, merge_size=2,
                             temporal_patch_size=2).save_pretrained(folder)


def qwen2_vl_base(folder: Path, seed: int = 0) -> Path:
    """A tiny ``Qwen2VLForConditionalGeneration`` with its tokenizer and processor settings in ``folder``."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from flowrl.rewards.videoalign_prompt import DETAILED_SPECIAL

    tokenizer = _tokenizer([DETAILED_SPECIAL] * 20)
    vision = {"depth": 1, "embed_dim": 16, "hidden_size": 16, "mlp_ratio": 1, "num_heads": 2, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2}
    torch.manual_seed(seed)
    Qwen2VLForConditionalGeneration(Qwen2VLConfig(**_configs(tokenizer, vision))).save_pretrained(folder)
    _save_processor(folder, tokenizer)
    return folder


def qwen25_vl_judge(folder: Path, seed: int = 0) -> Path:
    """A tiny ``Qwen2_5_VLForConditionalGeneration`` with its tokenizer and processor settings: VideoScore2's layout."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from flowrl.rewards.videoscore2 import QUERY_TEMPLATE

    tokenizer = _tokenizer([QUERY_TEMPLATE.template] * 20)
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
              "fullatt_block_indexes": [0], "window_size": 56}
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**_configs(tokenizer, vision))).save_pretrained(folder)
    _save_processor(folder, tokenizer)
    return folder


def videoalign_folder(folder: Path, base: Path, lora: bool = False, step: int = 7, seed: int = 1,
                      norm: bool = True) -> Path:
    """A VideoAlign checkpoint folder on the tiny ``base``: ``model_config.json`` as the published one (fps 2,
    ``detailed_special``, special reward tokens, output_dim 1) and ``checkpoint-<step>`` with random trained weights,
    whole (``model.pth``) or as a LoRA adapter (r 4, alpha 8) on the language model's linear layers."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    from flowrl.rewards.videoalign_checkpoint import to_transformers4
    from flowrl.rewards.videoalign_prompt import SPECIAL_TOKENS

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    net = Qwen2VLForConditionalGeneration.from_pretrained(base)
    net.resize_token_embeddings(len(tokenizer))
    torch.manual_seed(seed)
    net.rm_head = torch.nn.Linear(16, 1, bias=False)
    state = to_transformers4(net.state_dict())
    peft = {"lora_enable": lora, "lora_r": 4, "lora_alpha": 8, "use_rslora": False}
    config = {"data_config": {"fps": 2.0, "num_frames": None, "max_frame_pixels": MAX_PIXELS, "eval_dim":
                              ["VQ", "MQ", "TA"], "prompt_template_type": "detailed_special", "sample_type": "uniform"},
              "model_config": {"model_name_or_path": str(base), "output_dim": 1, "use_special_tokens": True,
                               "reward_token": "special"},
              "peft_lora_config": peft}
    if norm:
        config["inference_config"] = {"VQ_mean": 0.5, "VQ_std": 2.0, "MQ_mean": -1.0, "MQ_std": 0.5,
                                      "TA_mean": 0.0, "TA_std": 4.0}
    step_dir = folder / f"checkpoint-{step}"
    step_dir.mkdir(parents=True)
    (folder / "model_config.json").write_text(json.dumps(config))
    if not lora:
        torch.save(state, step_dir / "model.pth")
        return folder
    adapter = {}
    for key in [k for k in state if k.startswith("model.layers.") and k.endswith("proj.weight")]:
        out, inp = state[key].shape
        stem = "base_model.model." + key[:-len(".weight")]
        adapter[f"{stem}.lora_A.weight"] = torch.randn(4, inp)
        adapter[f"{stem}.lora_B.weight"] = torch.randn(out, 4)
    save_file(adapter, step_dir / "adapter_model.safetensors")
    full = {f"base_model.model.{k}": v for k, v in state.items() if k.startswith(("rm_head", "model.embed_tokens"))}
    torch.save(full, step_dir / "non_lora_state_dict.pth")
    return folder


def clip(frames: int = 9, height: int = 28, width: int = 56, seed: int = 0) -> torch.Tensor:
    """A random clip ``[F, 3, H, W]`` in ``[0, 1]``."""
    return torch.rand(frames, 3, height, width, generator=torch.Generator().manual_seed(seed))
