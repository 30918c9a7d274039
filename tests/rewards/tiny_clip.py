"""A tiny random-weight CLIP (model + tokenizer + image processor) saved in transformers layout.

Built from configs the way the real ones are published, so the rewards load it through the same
``from_pretrained`` path as ``yuvalkirstain/PickScore_v1``: hidden 32, 2 layers, 32 px images.
"""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE_SIZE = 32
PROJECTION_DIM = 16


def byte_vocab() -> list[str]:
    """The 256 printable stand-ins of byte-level BPE (GPT-2 / CLIP), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tiny_tokenizer():
    """A CLIPTokenizer over single bytes (+ end-of-word forms) and a few merges; special tokens have the top ids."""
    from transformers import CLIPTokenizer

    symbols = byte_vocab()
    merges = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>"), ("r", "e"), ("re", "d</w>")]
    tokens = symbols + [s + "</w>" for s in symbols] + ["ca", "cat</w>", "do", "dog</w>", "re", "red</w>"]
    vocab = {t: i for i, t in enumerate(tokens + ["<|startoftext|>", "<|endoftext|>"])}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges)
    # transformers 5 ignores vocab_file=/merges_file=; a silent fallback would leave 3 tokens.
    assert tokenizer.vocab_size == len(vocab) == 2 * 256 + 6 + 2, tokenizer.vocab_size
    return tokenizer


def tiny_clip_config(tokenizer, hidden_act: str = "quick_gelu"):
    from transformers import CLIPConfig

    text = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=16, hidden_act=hidden_act,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  image_size=IMAGE_SIZE, patch_size=8, hidden_act=hidden_act)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=PROJECTION_DIM)


def tiny_processor(tokenizer):
    from transformers import CLIPImageProcessorPil, CLIPProcessor

    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return CLIPProcessor(image_processor=images, tokenizer=tokenizer)


def save_tiny_clip(path: Path, seed: int = 0, hidden_act: str = "quick_gelu") -> Path:
    """Writes a random CLIPModel and its processor to ``path`` (``save_pretrained`` both); returns ``path``."""
    from transformers import CLIPModel

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    CLIPModel(tiny_clip_config(tokenizer, hidden_act)).save_pretrained(path)
    tiny_processor(tokenizer).save_pretrained(path)
    return path


def set_constant_embeddings(path: Path, image_vec: torch.Tensor, text_vec: torch.Tensor, logit_scale: float) -> Path:
    """Rewrites the saved model so every image embeds to ``image_vec`` and every prompt to ``text_vec``.

    A LayerNorm with weight 0 outputs its bias whatever the input: the pooled vectors become the one-hot
    ``e_0``, and a projection whose first column is ``v`` maps ``e_0`` to ``v``.
    """
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(path)
    with torch.no_grad():
        for norm, projection, vec in ((model.vision_model.post_layernorm, model.visual_projection, image_vec),
                                      (model.text_model.final_layer_norm, model.text_projection, text_vec)):
            norm.weight.zero_()
            norm.bias.zero_()
            norm.bias[0] = 1.0
            projection.weight[:, 0] = vec
        model.logit_scale.fill_(torch.tensor(logit_scale).log().item())
    model.save_pretrained(path)
    return path


def to_open_clip_layout(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of flowrl's key map, written independently: transformers CLIP keys -> open_clip keys."""
    sd = state_dict
    out = {
        "visual.conv1.weight": sd["vision_model.embeddings.patch_embedding.weight"],
        "visual.class_embedding": sd["vision_model.embeddings.class_embedding"],
        "visual.positional_embedding": sd["vision_model.embeddings.position_embedding.weight"],
        "visual.proj": sd["visual_projection.weight"].T.contiguous(),
        "token_embedding.weight": sd["text_model.embeddings.token_embedding.weight"],
        "positional_embedding": sd["text_model.embeddings.position_embedding.weight"],
        "text_projection": sd["text_projection.weight"].T.contiguous(),
        "logit_scale": sd["logit_scale"],
    }
    for oc, hf in (("visual.ln_pre", "vision_model.pre_layrnorm"), ("visual.ln_post", "vision_model.post_layernorm"),
                   ("ln_final", "text_model.final_layer_norm")):
        for p in ("weight", "bias"):
            out[f"{oc}.{p}"] = sd[f"{hf}.{p}"]
    for oc_tower, hf_tower in (("visual.transformer.resblocks", "vision_model.encoder.layers"),
                               ("transformer.resblocks", "text_model.encoder.layers")):
        layers = {k[len(hf_tower) + 1:].split(".")[0] for k in sd if k.startswith(hf_tower + ".")}
        for i in sorted(layers, key=int):
            a, b = f"{oc_tower}.{i}", f"{hf_tower}.{i}"
            for p in ("weight", "bias"):
                out[f"{a}.attn.in_proj_{p}"] = torch.cat([sd[f"{b}.self_attn.{x}_proj.{p}"] for x in "qkv"])
                out[f"{a}.attn.out_proj.{p}"] = sd[f"{b}.self_attn.out_proj.{p}"]
                out[f"{a}.ln_1.{p}"] = sd[f"{b}.layer_norm1.{p}"]
                out[f"{a}.ln_2.{p}"] = sd[f"{b}.layer_norm2.{p}"]
                out[f"{a}.mlp.c_fc.{p}"] = sd[f"{b}.mlp.fc1.{p}"]
                out[f"{a}.mlp.c_proj.{p}"] = sd[f"{b}.mlp.fc2.{p}"]
    return out
