"""The components of the embedded model, built from configs: one definition for the pretraining script, the
tests' random-weight models and anyone who wants a bigger or smaller variant.

- tokenizer: a word-level ``PreTrainedTokenizerFast`` over the digit-canvas vocabulary (built offline);
- text_encoder: a tiny ``CLIPTextModelWithProjection``. CLIP pools the hidden state at the first
  ``eos_token_id``; the vocabulary has no EOS, so the first ``[PAD]`` plays that role (prompts are always padded
  to ``MAX_LENGTH``, and under the causal mask that position has seen the whole prompt). ``eos_token_id == 2``
  would trigger CLIP's legacy argmax pooling, so it must not be 2;
- transformer: an ``SD3Transformer2DModel`` on 16x16 RGB pixels (no VAE);
- scheduler: ``FlowMatchEulerDiscreteScheduler`` with shift 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import diffusers
from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, PreTrainedTokenizerFast

from flowrl.digit_canvas import PAD_TOKEN, UNK_TOKEN, VOCAB

MAX_LENGTH = 8


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD_TOKEN, unk_token=UNK_TOKEN,
                                   model_max_length=MAX_LENGTH)


def build_text_encoder(pad_id: int, hidden_size: int = 32, num_layers: int = 2) -> CLIPTextModelWithProjection:
    config = CLIPTextConfig(vocab_size=len(VOCAB), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                            num_hidden_layers=num_layers, num_attention_heads=4, projection_dim=32,
                            max_position_embeddings=MAX_LENGTH, pad_token_id=pad_id, bos_token_id=pad_id,
                            eos_token_id=pad_id)
    return CLIPTextModelWithProjection(config)


def build_transformer(num_layers: int = 4, num_heads: int = 4, head_dim: int = 16,
                      text_dim: int = 32) -> SD3Transformer2DModel:
    return SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=3, out_channels=3, num_layers=num_layers,
                                 attention_head_dim=head_dim, num_attention_heads=num_heads,
                                 joint_attention_dim=text_dim, caption_projection_dim=num_heads * head_dim,
                                 pooled_projection_dim=32, pos_embed_max_size=16)


def build_scheduler() -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)


def build_components(num_layers: int = 4, text_layers: int = 2) -> dict:
    """Fresh (random-weight) components of the embedded model."""
    tokenizer = build_tokenizer()
    return {"tokenizer": tokenizer,
            "text_encoder": build_text_encoder(tokenizer.pad_token_id, num_layers=text_layers),
            "transformer": build_transformer(num_layers=num_layers), "scheduler": build_scheduler()}


def save_components(components: dict, out: str | Path, **save_kwargs) -> Path:
    """Write components in diffusers folder layout (one subfolder each, plus ``model_index.json``)."""
    out = Path(out)
    for name, component in components.items():
        kwargs = save_kwargs if name in ("text_encoder", "transformer") else {}
        component.save_pretrained(out / name, **kwargs)
    index = {"_class_name": "FlowRLTinyPipeline", "_diffusers_version": diffusers.__version__,
             **{name: [type(c).__module__.split(".")[0], type(c).__name__] for name, c in components.items()}}
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out
