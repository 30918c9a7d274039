"""Tiny offline stand-ins for the Qwen tokenizers the new families ship (Qwen-Image: Qwen2.5-VL's; FLUX.2 [klein] and
Z-Image: Qwen3's): a real ``Qwen2Tokenizer`` (byte-level BPE, Qwen's pre-tokenizer) whose vocabulary and merges are
trained here on a small corpus, with the special tokens and chat template the pipelines read.

The one hard constraint is Qwen-Image's: ``QwenImagePipeline`` drops the first ``prompt_template_encode_start_idx``
(34) hidden states by index, assuming its system prefix tokenizes to exactly 34 tokens as with the real tokenizer,
so the corpus is the template itself and the build checks the count.
"""

from __future__ import annotations

import json

from transformers import Qwen2Tokenizer

IM_TOKENS = ["<|im_start|>", "<|im_end|>"]
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
THINK_TOKENS = ["<think>", "</think>"]
WORDS = "a photo of a red cat and a blue dog on the grass, a green tree, dance monkey, bad quality"
# Qwen's chat format for role/content messages; with enable_thinking=False Qwen3 appends an empty think block after
# the assistant header (FLUX.2 [klein] asks for that, Z-Image asks for thinking and gets none)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def qwen_tokenizer(corpus: list[str], special: list[str], added: tuple[str, ...] = (),
                   vocab_size: int = 512) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` with BPE merges trained on ``corpus`` (``<|endoftext|>`` is unk, eos and pad)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    # tokenizers writes merges as pairs or as "a b" strings depending on its version; Qwen2Tokenizer wants pairs
    merges = [tuple(m) if isinstance(m, (list, tuple)) else tuple(m.split(" "))
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=bpe.get_vocab(), merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    if added:
        tokenizer.add_tokens(list(added))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 32768
    return tokenizer


def qwen_image_tokenizer(template: str, drop: int) -> Qwen2Tokenizer:
    """Qwen2.5-VL's tokenizer as ``QwenImagePipeline`` uses it: ``template``'s prefix (before ``{}``) must be
    ``drop`` tokens long."""
    tokenizer = qwen_tokenizer([template.replace("{}", "")] * 50 + [WORDS] * 20, IM_TOKENS + VISION_TOKENS)
    prefix = len(tokenizer(template.split("{}")[0]).input_ids)
    if prefix != drop:
        raise AssertionError(f"the template prefix is {prefix} tokens; QwenImagePipeline drops {drop}")
    return tokenizer


def qwen3_tokenizer() -> Qwen2Tokenizer:
    """Qwen3's tokenizer as ``Flux2KleinPipeline`` and ``ZImagePipeline`` use it (chat template, think tokens)."""
    turn = f"<|im_start|>user\n{WORDS}<|im_end|>\n<|im_start|>assistant\n"
    return qwen_tokenizer([turn] * 20, IM_TOKENS, tuple(THINK_TOKENS))
