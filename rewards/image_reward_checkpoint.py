"""The published ``ImageReward.pt`` state dict mapped onto :class:`~flowrl.rewards.image_reward_model.ImageRewardModel`.

The published checkpoint is the raw ``state_dict`` of ``ImageReward`` (``blip.visual_encoder.*``: a timm-style ViT;
``blip.text_encoder.*``: BLIP's ``med.py`` BERT with cross-attention; ``mlp.layers.N.*``: the head). The text
encoder's names already match transformers' ``BlipTextModel`` (it was ported from the same ``med.py``); the ViT's
are renamed (``blocks.N.attn.qkv`` -> ``encoder.layers.N.self_attn.qkv``, whose fused q/k/v row order is the same).
Dropped: ``blip.vision_proj``/``blip.text_proj`` (contrastive projections the score does not use) and the
``position_ids`` buffer. Any other key is an error, so a checkpoint of another layout cannot load half-mapped.

The config comes from the tensor shapes (widths, depths, vocabulary, patch and image size) plus the published
``med_config.json`` for what shapes cannot tell (text heads, eps, activation); the ViT's heads are its width / 64,
true of BLIP's ViT-B (768 / 12) and ViT-L (1024 / 16).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor
from transformers import AutoTokenizer, BlipConfig

from flowrl.rewards.image_reward_model import ImageRewardModel

VIT = "blip.visual_encoder."
VIT_RE = re.escape(VIT)
RENAMES = [  # (published key prefix, transformers key prefix); the first match wins
    (VIT_RE + r"cls_token$", "vision_model.embeddings.class_embedding"),
    (VIT_RE + r"pos_embed$", "vision_model.embeddings.position_embedding"),
    (VIT_RE + r"patch_embed\.proj\.", "vision_model.embeddings.patch_embedding."),
    (VIT_RE + r"blocks\.(\d+)\.norm1\.", r"vision_model.encoder.layers.\1.layer_norm1."),
    (VIT_RE + r"blocks\.(\d+)\.norm2\.", r"vision_model.encoder.layers.\1.layer_norm2."),
    (VIT_RE + r"blocks\.(\d+)\.attn\.qkv\.", r"vision_model.encoder.layers.\1.self_attn.qkv."),
    (VIT_RE + r"blocks\.(\d+)\.attn\.proj\.", r"vision_model.encoder.layers.\1.self_attn.projection."),
    (VIT_RE + r"blocks\.(\d+)\.mlp\.fc([12])\.", r"vision_model.encoder.layers.\1.mlp.fc\2."),
    (VIT_RE + r"norm\.", "vision_model.post_layernorm."),
    (r"blip\.text_encoder\.", "text_encoder."),
    (r"mlp\.layers\.(\d+)\.", r"mlp.\1."),
]
DROPPED = re.compile(r"blip\.(vision_proj|text_proj)\.|blip\.text_encoder\.embeddings\.position_ids$")
VIT_HEAD_DIM = 64
PUBLISHED_REPO = "THUDM/ImageReward"
PUBLISHED_FILE = "ImageReward.pt"
DEFAULT_TOKENIZER = "bert-base-uncased"


def rename_key(key: str) -> Optional[str]:
    """The transformers name of a published key; ``None`` for a key the score does not use.

    >>> rename_key("blip.visual_encoder.blocks.3.attn.qkv.weight")
    'vision_model.encoder.layers.3.self_attn.qkv.weight'
    >>> rename_key("mlp.layers.6.bias"), rename_key("blip.text_proj.weight")
    ('mlp.6.bias', None)

    Raises:
        KeyError: a key of no known layout.
    """
    if DROPPED.match(key):
        return None
    for pattern, target in RENAMES:
        renamed, hits = re.subn("^" + pattern, target, key, count=1)
        if hits:
            return renamed
    raise KeyError(f"ImageReward checkpoint key {key!r} matches no known layer; is this the published "
                   f"ImageReward.pt (keys blip.visual_encoder.*, blip.text_encoder.*, mlp.layers.*)?")


def convert_state_dict(published: dict[str, Tensor]) -> dict[str, Tensor]:
    """The published state dict with transformers names (unused keys dropped)."""
    converted = {}
    for key, value in published.items():
        name = rename_key(key)
        if name is not None:
            converted[name] = value
    return converted


def config_from_state_dict(published: dict[str, Tensor], med_config: Optional[dict] = None) -> BlipConfig:
    """A :class:`~transformers.BlipConfig` whose shapes match ``published``.

    Args:
        published: the published state dict.
        med_config: the published ``med_config.json`` (text heads, eps, activation); BERT-base values if ``None``.
    """
    med = med_config or {}
    shape = lambda key: published[key].shape  # noqa: E731
    depth = lambda pattern: len({m.group(1) for k in published if (m := re.match(pattern, k))})  # noqa: E731
    vit_width, patch = shape(VIT + "cls_token")[-1], shape(VIT + "patch_embed.proj.weight")[-1]
    vocab, text_width = shape("blip.text_encoder.embeddings.word_embeddings.weight")
    vision = dict(hidden_size=vit_width, intermediate_size=shape(VIT + "blocks.0.mlp.fc1.weight")[0],
                  num_hidden_layers=depth(r"blip\.visual_encoder\.blocks\.(\d+)\."),
                  num_attention_heads=max(1, vit_width // VIT_HEAD_DIM), patch_size=patch,
                  image_size=round((shape(VIT + "pos_embed")[1] - 1) ** 0.5) * patch,
                  hidden_act="gelu", layer_norm_eps=1e-6)  # BLIP vit.py: nn.GELU, LayerNorm(eps=1e-6)
    text = dict(vocab_size=vocab, hidden_size=text_width,
                intermediate_size=shape("blip.text_encoder.encoder.layer.0.intermediate.dense.weight")[0],
                num_hidden_layers=depth(r"blip\.text_encoder\.encoder\.layer\.(\d+)\."),
                num_attention_heads=med.get("num_attention_heads", max(1, text_width // 64)),
                max_position_embeddings=shape("blip.text_encoder.embeddings.position_embeddings.weight")[0],
                hidden_act=med.get("hidden_act", "gelu"), layer_norm_eps=med.get("layer_norm_eps", 1e-12),
                pad_token_id=med.get("pad_token_id", 0),
                is_decoder=True)  # transformers builds the cross-attention layers only for a "decoder"
    return BlipConfig(vision_config=vision, text_config=text)


def model_from_published(published: dict[str, Tensor], med_config: Optional[dict] = None) -> ImageRewardModel:
    """An :class:`ImageRewardModel` holding the published weights (every tensor checked by a strict load)."""
    model = ImageRewardModel(config_from_state_dict(published, med_config))
    model.load_state_dict(convert_state_dict(published), strict=True)
    return model.eval()


def blip_tokenizer(name_or_path: str = DEFAULT_TOKENIZER):
    """BLIP's tokenizer (``init_tokenizer``): BERT's ``bert-base-uncased`` plus the ``[DEC]`` and ``[ENC]`` tokens."""
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


def load_published(path: str | Path, tokenizer: str = DEFAULT_TOKENIZER):
    """``(model, tokenizer)`` from a published ``ImageReward.pt`` (``med_config.json`` read from beside it, if there).

    Raises:
        ValueError: the tokenizer's vocabulary does not match the checkpoint's embedding table.
    """
    path = Path(path)
    published = torch.load(path, map_location="cpu", weights_only=True)
    med_path = path.parent / "med_config.json"
    med_config = json.loads(med_path.read_text()) if med_path.is_file() else None
    model, tok = model_from_published(published, med_config), blip_tokenizer(tokenizer)
    check_vocabulary(model, tok)
    return model, tok


def check_vocabulary(model: ImageRewardModel, tokenizer) -> None:
    """Raises ``ValueError`` unless the tokenizer's vocabulary size equals the model's embedding rows."""
    rows = model.config.text_config.vocab_size
    if len(tokenizer) != rows:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has {len(tokenizer)} tokens but the ImageReward "
                         f"text encoder has {rows} embeddings; use BERT's bert-base-uncased with BLIP's [DEC] and "
                         f"[ENC] (30522 + 2 = 30524)")
