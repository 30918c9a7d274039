"""ImageReward on a tiny random BLIP: the published checkpoint layout round-trips through the key map, a plain-torch
forward written from the published ``vit.py``/``med.py`` agrees with the transformers port, the conversion script
and the in-memory conversion give the same scores, and the preprocessing matches torchvision's pipeline."""

import json
import math
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import BertTokenizer, BlipConfig
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from flowrl.rewards import ImageReward
from flowrl.rewards.image_reward_checkpoint import convert_state_dict, model_from_published, rename_key
from flowrl.rewards.image_reward_model import CLIP_MEAN, CLIP_STD, ImageRewardModel, preprocess
from flowrl.rewards.pil_images import to_pil

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "photo", "of", "the", "red", "blue", "cat", "dog", "on",
         "mat", "sky", "##s", "at", "night", "painting", "with", "two"]
VIT_LAYERS, TEXT_LAYERS, VIT_HEADS, TEXT_HEADS, PATCH = 2, 2, 2, 4, 32
PROMPTS = ["a photo of a red cat", "two blue dogs on the mat", "a painting of the sky at night", "a cat",
           "a red dog with a blue cat on a mat", "the sky", "photo", "two cats and two dogs at night"]


def published_keys(model_keys):
    """The published ``ImageReward.pt`` name of every transformers key, written out layer by layer from the
    published modules (``ImageReward.py``: ``blip.*`` and ``mlp.layers``; BLIP ``vit.py`` and ``med.py``)."""
    out = {"vision_model.embeddings.class_embedding": "blip.visual_encoder.cls_token",
           "vision_model.embeddings.position_embedding": "blip.visual_encoder.pos_embed",
           "vision_model.post_layernorm.weight": "blip.visual_encoder.norm.weight",
           "vision_model.post_layernorm.bias": "blip.visual_encoder.norm.bias"}
    for kind in ("weight", "bias"):
        out[f"vision_model.embeddings.patch_embedding.{kind}"] = f"blip.visual_encoder.patch_embed.proj.{kind}"
        for i in range(VIT_LAYERS):
            ours, theirs = f"vision_model.encoder.layers.{i}", f"blip.visual_encoder.blocks.{i}"
            for a, b in [("layer_norm1", "norm1"), ("layer_norm2", "norm2"), ("self_attn.qkv", "attn.qkv"),
                         ("self_attn.projection", "attn.proj"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")]:
                out[f"{ours}.{a}.{kind}"] = f"{theirs}.{b}.{kind}"
        for i in (0, 2, 4, 6, 7):  # the Linear layers' nn.Sequential indices (dropouts between them)
            out[f"mlp.{i}.{kind}"] = f"mlp.layers.{i}.{kind}"
    for key in model_keys:
        if key.startswith("text_encoder."):
            out[key] = "blip." + key
    return out


def blip_config(vocab_size):
    vision = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=VIT_LAYERS, num_attention_heads=VIT_HEADS,
                  image_size=224, patch_size=PATCH, layer_norm_eps=1e-6)
    text = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=TEXT_LAYERS,
                num_attention_heads=TEXT_HEADS, max_position_embeddings=40, is_decoder=True)
    return BlipConfig(vision_config=vision, text_config=text)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random transformers model, its published-layout state dict, and folders holding both."""
    root = tmp_path_factory.mktemp("image_reward")
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    tokenizer.save_pretrained(root / "bert")
    torch.manual_seed(0)
    model = ImageRewardModel(blip_config(len(tokenizer))).eval()
    with torch.no_grad():  # no two tensors alike (LayerNorms start at 1/0), so a swapped pair cannot go unseen
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    names = published_keys(model.state_dict())
    published = {names[k]: v.clone() for k, v in model.state_dict().items()}
    # present in the published file, unused by the score
    published["blip.vision_proj.weight"], published["blip.text_proj.weight"] = torch.randn(8, 128), torch.randn(8, 64)
    published["blip.text_encoder.embeddings.position_ids"] = torch.arange(40)[None]
    (root / "published").mkdir()
    torch.save(published, root / "published" / "ImageReward.pt")
    med = {"num_attention_heads": TEXT_HEADS, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
           "vocab_size": len(tokenizer)}
    (root / "published" / "med_config.json").write_text(json.dumps(med))
    return dict(root=root, model=model, published=published, med=med, tokenizer=tokenizer)


def test_published_key_names_and_round_trip(tiny):
    model, published = tiny["model"], tiny["published"]
    names = published_keys(model.state_dict())
    assert set(names) == set(model.state_dict())  # the test's inverse map covers every transformers tensor
    hidden = 128
    assert published["blip.visual_encoder.blocks.1.attn.qkv.weight"].shape == (3 * hidden, hidden)
    assert published["blip.visual_encoder.pos_embed"].shape == (1, (224 // PATCH) ** 2 + 1, hidden)
    assert published["blip.text_encoder.encoder.layer.1.crossattention.self.key.weight"].shape == (64, hidden)
    assert published["blip.text_encoder.encoder.layer.0.attention.output.LayerNorm.bias"].shape == (64,)
    assert [published[f"mlp.layers.{i}.weight"].shape[0] for i in (0, 2, 4, 6, 7)] == [1024, 128, 64, 16, 1]
    converted = convert_state_dict(published)
    assert converted.keys() == model.state_dict().keys()
    assert all(torch.equal(converted[k], v) for k, v in model.state_dict().items())
    with pytest.raises(KeyError, match="blip.text_decoder.cls.predictions.bias"):
        rename_key("blip.text_decoder.cls.predictions.bias")


def test_config_from_shapes_matches(tiny):
    rebuilt = model_from_published(tiny["published"], tiny["med"]).config
    for part, expected in [(rebuilt.vision_config, tiny["model"].config.vision_config),
                           (rebuilt.text_config, tiny["model"].config.text_config)]:
        for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "layer_norm_eps",
                      "hidden_act"):
            assert getattr(part, field) == getattr(expected, field), field
    assert rebuilt.vision_config.image_size == 224 and rebuilt.vision_config.patch_size == PATCH
    assert rebuilt.text_config.encoder_hidden_size == 128 and rebuilt.text_config.vocab_size == len(WORDS) + 2


def reference_forward(sd, pixel_values, input_ids, attention_mask):
    """ImageReward's raw head output from the published state dict, with plain torch ops following BLIP ``vit.py``
    (pre-norm blocks, eps 1e-6, exact GELU, final norm) and ``med.py`` (post-norm BERT, self-attention with the
    -10000 padding mask, cross-attention to every image token, eps 1e-12) and ``ImageReward.py`` (token 0, the MLP
    without activations)."""
    ln = lambda x, key, eps: F.layer_norm(x, x.shape[-1:], sd[key + ".weight"], sd[key + ".bias"], eps)  # noqa: E731
    lin = lambda x, key: F.linear(x, sd[key + ".weight"], sd[key + ".bias"])  # noqa: E731

    def attend(q, k, v, heads, bias=None):
        split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731  [B, H, L, d]
        scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(q.shape[-1] // heads)
        probs = (scores if bias is None else scores + bias).softmax(-1)
        return (probs @ split(v)).transpose(1, 2).flatten(2)

    v = "blip.visual_encoder"
    x = F.conv2d(pixel_values, sd[f"{v}.patch_embed.proj.weight"], sd[f"{v}.patch_embed.proj.bias"], stride=PATCH)
    x = torch.cat([sd[f"{v}.cls_token"].expand(len(x), 1, -1), x.flatten(2).transpose(1, 2)], 1) + sd[f"{v}.pos_embed"]
    for i in range(VIT_LAYERS):
        b = f"{v}.blocks.{i}"
        q, k, val = lin(ln(x, f"{b}.norm1", 1e-6), f"{b}.attn.qkv").chunk(3, dim=-1)
        x = x + lin(attend(q, k, val, VIT_HEADS), f"{b}.attn.proj")
        x = x + lin(F.gelu(lin(ln(x, f"{b}.norm2", 1e-6), f"{b}.mlp.fc1")), f"{b}.mlp.fc2")
    image = ln(x, f"{v}.norm", 1e-6)

    t = "blip.text_encoder"
    positions = sd[f"{t}.embeddings.position_embeddings.weight"][: input_ids.shape[1]]
    x = ln(sd[f"{t}.embeddings.word_embeddings.weight"][input_ids] + positions, f"{t}.embeddings.LayerNorm", 1e-12)
    pad = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
    for i in range(TEXT_LAYERS):
        b = f"{t}.encoder.layer.{i}"
        a = attend(*(lin(x, f"{b}.attention.self.{n}") for n in ("query", "key", "value")), TEXT_HEADS, pad)
        x = ln(lin(a, f"{b}.attention.output.dense") + x, f"{b}.attention.output.LayerNorm", 1e-12)
        c = attend(lin(x, f"{b}.crossattention.self.query"), lin(image, f"{b}.crossattention.self.key"),
                   lin(image, f"{b}.crossattention.self.value"), TEXT_HEADS)
        x = ln(lin(c, f"{b}.crossattention.output.dense") + x, f"{b}.crossattention.output.LayerNorm", 1e-12)
        x = ln(lin(F.gelu(lin(x, f"{b}.intermediate.dense")), f"{b}.output.dense") + x, f"{b}.output.LayerNorm", 1e-12)
    features = x[:, 0]
    for i in (0, 2, 4, 6, 7):
        features = lin(features, f"mlp.layers.{i}")
    return features.squeeze(-1)


def test_port_agrees_with_a_plain_torch_forward_of_the_published_modules(tiny):
    torch.manual_seed(1)
    pixels = torch.randn(3, 3, 224, 224)
    tokens = tiny["tokenizer"](PROMPTS[:3], padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    # [CLS] + 6 words + [SEP]; "dogs" is "dog ##s"; padded to 35, so the mask matters
    assert tokens["attention_mask"].sum(1).tolist() == [8, 9, 9]
    with torch.no_grad():
        ours = tiny["model"](pixels, tokens["input_ids"], tokens["attention_mask"])
        expected = reference_forward(tiny["published"], pixels, tokens["input_ids"], tokens["attention_mask"])
    assert ours.shape == (3,) and ours.dtype == torch.float32
    assert expected.abs().min() > 1e-3 and (expected[0] - expected[1]).abs() > 1e-4  # not a degenerate model
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(2)
    return torch.rand(8, 3, 64, 48)


def test_reward_scores_published_layout_and_standardises(tiny, images):
    reward = ImageReward(model=str(tiny["root"] / "published" / "ImageReward.pt"), tokenizer=str(tiny["root"] / "bert"),
                         batch_size=8).load("cpu")
    scores = reward.score(images, PROMPTS)
    pixels = preprocess(to_pil(images))
    tokens = tiny["tokenizer"](PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    with torch.no_grad():
        raw = tiny["model"](pixels, tokens["input_ids"], tokens["attention_mask"])
    torch.testing.assert_close(scores, (raw - 0.16717362830052426) / 1.0333394966054072, rtol=0, atol=1e-6)
    assert scores.shape == (8,) and scores.std() > 1e-4
    assert torch.equal(reward.score(images, PROMPTS), scores)  # deterministic
    one_by_one = ImageReward(model=str(tiny["root"] / "published"), tokenizer=str(tiny["root"] / "bert"), batch_size=1)
    torch.testing.assert_close(one_by_one.score(images, PROMPTS), scores, rtol=0, atol=1e-5)


def test_conversion_script_output_loads_and_scores_the_same(tiny, images, tmp_path):
    out = tmp_path / "converted"
    script = runpy.run_path(str(ROOT / "scripts" / "convert_image_reward_checkpoint.py"), run_name="convert")
    script["main"](["--checkpoint", str(tiny["root"] / "published" / "ImageReward.pt"),
                    "--tokenizer", str(tiny["root"] / "bert"), "--out", str(out)])
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    converted = ImageReward(model=str(out), batch_size=4)
    in_memory = ImageReward(model=str(tiny["root"] / "published" / "ImageReward.pt"),
                            tokenizer=str(tiny["root"] / "bert"), batch_size=4)
    assert torch.equal(converted.score(images, PROMPTS), in_memory.score(images, PROMPTS))
    assert len(converted.tokenizer) == len(WORDS) + 2


def test_bad_inputs_fail_clearly(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageReward(model=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="convert_image_reward_checkpoint"):
        ImageReward(model=str(tmp_path / "empty")).load("cpu")
    short = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS[:-3])})  # 19 + [DEC], [ENC] != 24 embeddings
    short.save_pretrained(tmp_path / "short")
    with pytest.raises(ValueError, match=r"\[DEC\] and \[ENC\]"):
        ImageReward(model=str(tiny["root"] / "published"), tokenizer=str(tmp_path / "short")).load("cpu")


def torchvision_reference(image, size=224):
    """torchvision's Resize(size, BICUBIC) + CenterCrop(size) + ToTensor + Normalize, step by step."""
    w, h = image.size
    new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    array = np.asarray(image.resize(new, Image.BICUBIC) if new != (w, h) else image, dtype=np.float32) / 255
    top, left = int(round((array.shape[0] - size) / 2.0)), int(round((array.shape[1] - size) / 2.0))
    array = (array[top:top + size, left:left + size] - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


def test_preprocessing_matches_torchvision_and_clip_processor():
    rng = np.random.default_rng(0)
    clip = CLIPImageProcessorPil(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224},
                                 resample=Image.BICUBIC, image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))
    for size in [(512, 512), (64, 64), (300, 227), (227, 300), (100, 37)]:
        image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        ours = preprocess([image])[0]
        assert ours.shape == (3, 224, 224)
        torch.testing.assert_close(ours, torch.from_numpy(clip(images=image)["pixel_values"][0]), rtol=0, atol=1e-6)
        torch.testing.assert_close(ours, torchvision_reference(image), rtol=0, atol=0)
    # 231 x 224: no resize, a 7-pixel excess; torchvision crops at round(3.5) = 4 (the CLIP processor at 7 // 2 = 3)
    image = Image.fromarray(rng.integers(0, 256, (224, 231, 3), dtype=np.uint8))
    array = (np.asarray(image, dtype=np.float32) / 255 - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)
    torch.testing.assert_close(preprocess([image])[0], torch.from_numpy(array[:, 4:228].transpose(2, 0, 1).copy()))


def test_bfloat16_runs_the_encoders_in_bfloat16_and_the_head_in_float32(tiny, images):
    path = str(tiny["root"] / "published" / "ImageReward.pt")
    full = ImageReward(model=path, tokenizer=str(tiny["root"] / "bert")).score(images, PROMPTS)
    half = ImageReward(model=path, tokenizer=str(tiny["root"] / "bert"), dtype="bfloat16").load("cpu")
    assert half.model.vision_model.embeddings.patch_embedding.weight.dtype == torch.bfloat16
    assert half.model.text_encoder.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    assert half.model.mlp[0].weight.dtype == torch.float32
    scores = half.score(images, PROMPTS)
    assert scores.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa (0.4% per rounding); measured here: 0.7% at most
    torch.testing.assert_close(scores, full, rtol=0.02, atol=0)
