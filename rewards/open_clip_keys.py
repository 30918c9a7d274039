"""open_clip CLIP weights -> transformers ``CLIPModel``: the key map, and the config read off the tensor shapes.

HPSv2 ships its scorer as an open_clip ViT-H-14 state dict (``HPS_v2_compressed.pt``, ``HPS_v2.1_compressed.pt`` on
the hub repo ``xswu/HPSv2``, the weights under ``"state_dict"``). open_clip cannot be imported here (it needs
torchvision), and transformers' ``CLIPModel`` computes the same function, so the weights are renamed:

=========================================================  ========================================================
open_clip key                                              transformers key
=========================================================  ========================================================
``visual.conv1.weight``                                    ``vision_model.embeddings.patch_embedding.weight``
``visual.class_embedding``                                 ``vision_model.embeddings.class_embedding``
``visual.positional_embedding``                            ``vision_model.embeddings.position_embedding.weight``
``visual.ln_pre.*`` / ``visual.ln_post.*``                 ``vision_model.pre_layrnorm.*`` / ``.post_layernorm.*``
``visual.proj`` ``[W, E]``                                 ``visual_projection.weight`` ``[E, W]`` (transposed)
``token_embedding.weight``                                 ``text_model.embeddings.token_embedding.weight``
``positional_embedding``                                   ``text_model.embeddings.position_embedding.weight``
``ln_final.*``                                             ``text_model.final_layer_norm.*``
``text_projection`` ``[W, E]``                             ``text_projection.weight`` ``[E, W]`` (transposed)
``logit_scale``                                            ``logit_scale``
``{visual.}transformer.resblocks.{i}.ln_1.*``              ``{vision,text}_model.encoder.layers.{i}.layer_norm1.*``
``...attn.in_proj_weight`` ``[3W, W]`` (q; k; v stacked)   ``...self_attn.{q,k,v}_proj.weight`` (split in thirds)
``...attn.in_proj_bias`` ``[3W]``                          ``...self_attn.{q,k,v}_proj.bias``
``...attn.out_proj.*``                                     ``...self_attn.out_proj.*``
``...ln_2.*``                                              ``...layer_norm2.*``
``...mlp.c_fc.*`` / ``...mlp.c_proj.*``                    ``...mlp.fc1.*`` / ``...mlp.fc2.*``
=========================================================  ========================================================

A ``module.`` prefix (DDP) is stripped and ``attn_mask`` buffers (the causal mask, rebuilt by transformers) are
dropped; any other key is an error, so a tower this map does not know (LayerScale, attention pooling) fails loudly.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

_DIRECT = {
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
}
_TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}
_TOWERS = {"visual.transformer.resblocks.": "vision_model.encoder.layers.",
           "transformer.resblocks.": "text_model.encoder.layers."}
_BLOCK = {"ln_1.": "layer_norm1.", "ln_2.": "layer_norm2.", "attn.out_proj.": "self_attn.out_proj.",
          "mlp.c_fc.": "mlp.fc1.", "mlp.c_proj.": "mlp.fc2."}
_IGNORED = re.compile(r"(^|\.)attn_mask$")


def _strip(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k.removeprefix("module."): v for k, v in state_dict.items() if not _IGNORED.search(k)}


def _block(key: str, value: Tensor) -> Optional[dict[str, Tensor]]:
    for prefix, target in _TOWERS.items():
        if not key.startswith(prefix):
            continue
        index, rest = key[len(prefix):].split(".", 1)
        if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
            kind = rest.rsplit("_", 1)[1]
            q, k, v = value.chunk(3, dim=0)
            return {f"{target}{index}.self_attn.{name}_proj.{kind}": part.clone()
                    for name, part in zip("qkv", (q, k, v))}
        for src, dst in _BLOCK.items():
            if rest.startswith(src):
                return {f"{target}{index}.{dst}{rest[len(src):]}": value}
    return None


def open_clip_to_transformers(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename an open_clip CLIP state dict to transformers ``CLIPModel`` keys (see the module table).

    Raises:
        KeyError: keys the map does not know, all listed.

    Example:
        >>> out = open_clip_to_transformers({"transformer.resblocks.0.attn.in_proj_bias": torch.arange(3.0)})
        >>> [(k.split("self_attn.")[1], v.item()) for k, v in out.items()]
        [('q_proj.bias', 0.0), ('k_proj.bias', 1.0), ('v_proj.bias', 2.0)]
    """
    out, unknown = {}, []
    for key, value in _strip(state_dict).items():
        if key in _DIRECT:
            out[_DIRECT[key]] = value
        elif key in _TRANSPOSED:
            out[_TRANSPOSED[key]] = value.t().contiguous()
        elif (renamed := _block(key, value)) is not None:
            out.update(renamed)
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f"open_clip keys with no transformers CLIP counterpart: {unknown}; this converter handles "
                       f"the plain ViT + text transformer towers of open_clip CLIP (e.g. ViT-H-14)")
    return out


def _layers(state_dict: dict[str, Tensor], prefix: str) -> int:
    return len({k[len(prefix):].split(".", 1)[0] for k in state_dict if k.startswith(prefix)})


def clip_config_from_open_clip(state_dict: dict[str, Tensor], vision_heads: int = 16, text_heads: int = 16,
                               hidden_act: str = "gelu", layer_norm_eps: float = 1e-5, **text_kwargs):
    """The transformers ``CLIPConfig`` of an open_clip state dict: sizes from the shapes, heads and activation given.

    Head counts and the activation are not in the tensors; the defaults are open_clip's ViT-H-14 (vision width 1280
    with head width 80, text width 1024 with 16 heads, exact GELU). ``text_kwargs`` go to the text config (e.g. the
    tokenizer's ``eos_token_id``).
    """
    from transformers import CLIPConfig

    sd = _strip(state_dict)
    width, _, patch, _ = sd["visual.conv1.weight"].shape
    grid = sd["visual.positional_embedding"].shape[0] - 1
    side = math.isqrt(grid)
    vocab, text_width = sd["token_embedding.weight"].shape
    problems = [f"{grid} patch positions is not a square grid"] if side * side != grid else []
    problems += [f"{name} width {w} is not divisible by {h} heads"
                 for name, w, h in (("vision", width, vision_heads), ("text", text_width, text_heads)) if w % h]
    if problems:
        raise ValueError("cannot build a CLIP config from this open_clip state dict: " + "; ".join(problems))
    vision = dict(hidden_size=width, intermediate_size=sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                  num_hidden_layers=_layers(sd, "visual.transformer.resblocks."), num_attention_heads=vision_heads,
                  image_size=side * patch, patch_size=patch, hidden_act=hidden_act, layer_norm_eps=layer_norm_eps)
    text = dict(vocab_size=vocab, hidden_size=text_width,
                intermediate_size=sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                num_hidden_layers=_layers(sd, "transformer.resblocks."), num_attention_heads=text_heads,
                max_position_embeddings=sd["positional_embedding"].shape[0], hidden_act=hidden_act,
                layer_norm_eps=layer_norm_eps, **text_kwargs)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=sd["text_projection"].shape[1])


def clip_model_from_open_clip(state_dict: dict[str, Tensor], **config_kwargs):
    """A transformers ``CLIPModel`` holding an open_clip state dict (every key mapped, every weight filled)."""
    from transformers import CLIPModel

    model = CLIPModel(clip_config_from_open_clip(state_dict, **config_kwargs))
    model.load_state_dict(open_clip_to_transformers(state_dict), strict=True)
    return model


def load_open_clip_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The tensors of an open_clip checkpoint file (a bare state dict, or one under ``"state_dict"`` as HPSv2's)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    state_dict = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state_dict, dict) or not all(isinstance(v, Tensor) for v in state_dict.values()):
        raise ValueError(f"{path} holds no open_clip state dict (expected tensors, or tensors under 'state_dict')")
    return state_dict
