"""open_clip -> transformers CLIP key conversion: round trip on a tiny CLIP, documented key names, the script."""

import importlib.util
from pathlib import Path

import pytest
import torch

from flowrl.rewards.open_clip_keys import (clip_config_from_open_clip, clip_model_from_open_clip,
                                           load_open_clip_state_dict, open_clip_to_transformers)
from tests.rewards.tiny_clip import save_tiny_clip, tiny_clip_config, tiny_tokenizer, to_open_clip_layout

ROOT = Path(__file__).resolve().parents[2]

# open_clip's CLIP (VisionTransformer + text transformer) names, as in its model.py / transformer.py.
GLOBAL_KEYS = {
    "visual.class_embedding", "visual.positional_embedding", "visual.proj", "visual.conv1.weight",
    "visual.ln_pre.weight", "visual.ln_pre.bias", "visual.ln_post.weight", "visual.ln_post.bias",
    "token_embedding.weight", "positional_embedding", "text_projection", "ln_final.weight", "ln_final.bias",
    "logit_scale",
}
BLOCK_KEYS = {"ln_1.weight", "ln_1.bias", "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight",
              "attn.out_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
              "mlp.c_proj.weight", "mlp.c_proj.bias"}


@pytest.fixture(scope="module")
def tiny():
    from transformers import CLIPModel

    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    model = CLIPModel(tiny_clip_config(tokenizer, hidden_act="gelu")).eval()  # open_clip ViT-H-14 uses exact GELU
    return model, tokenizer, to_open_clip_layout(model.state_dict())


def test_open_clip_layout_has_the_documented_names(tiny):
    _, _, open_clip = tiny
    blocks = {f"{tower}.{i}.{k}" for tower in ("visual.transformer.resblocks", "transformer.resblocks")
              for i in range(2) for k in BLOCK_KEYS}
    assert set(open_clip) == GLOBAL_KEYS | blocks
    assert open_clip["transformer.resblocks.0.attn.in_proj_weight"].shape == (3 * 32, 32)  # q; k; v stacked
    assert open_clip["visual.proj"].shape == (32, 16)  # [width, embed]: used as x @ proj


def test_round_trip_is_exact_for_every_tensor(tiny):
    model, _, open_clip = tiny
    converted = open_clip_to_transformers(open_clip)
    original = model.state_dict()
    assert set(converted) == set(original)
    for key, value in original.items():
        assert converted[key].shape == value.shape and torch.equal(converted[key], value), key


def test_config_read_from_shapes_and_features_identical(tiny):
    model, tokenizer, open_clip = tiny
    config = clip_config_from_open_clip(open_clip, vision_heads=4, text_heads=4, eos_token_id=tokenizer.eos_token_id)
    for tower in ("vision_config", "text_config"):
        want, got = getattr(model.config, tower), getattr(config, tower)
        for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act"):
            assert getattr(got, field) == getattr(want, field), (tower, field)
    assert (config.vision_config.image_size, config.vision_config.patch_size) == (32, 8)
    assert (config.text_config.vocab_size, config.text_config.max_position_embeddings) == (520, 16)
    assert config.projection_dim == 16

    converted = clip_model_from_open_clip(open_clip, vision_heads=4, text_heads=4,
                                          eos_token_id=tokenizer.eos_token_id).eval()
    pixels = torch.randn(3, 3, 32, 32)
    tokens = tokenizer(["a red cat", "dog", "cat dog red"], padding=True, return_tensors="pt")
    with torch.no_grad():
        for fn, kwargs in (("get_image_features", dict(pixel_values=pixels)),
                           ("get_text_features", dict(input_ids=tokens.input_ids,
                                                      attention_mask=tokens.attention_mask))):
            assert torch.equal(getattr(converted, fn)(**kwargs).pooler_output,
                               getattr(model, fn)(**kwargs).pooler_output), fn


def test_ddp_prefix_and_attn_mask_are_handled_and_unknown_keys_named(tiny):
    _, _, open_clip = tiny
    wrapped = {f"module.{k}": v for k, v in open_clip.items()} | {"module.attn_mask": torch.zeros(16, 16)}
    assert set(open_clip_to_transformers(wrapped)) == set(open_clip_to_transformers(open_clip))
    with pytest.raises(KeyError, match=r"visual\.transformer\.resblocks\.0\.ls_1\.gamma"):
        open_clip_to_transformers(open_clip | {"visual.transformer.resblocks.0.ls_1.gamma": torch.ones(32)})
    with pytest.raises(ValueError, match="not divisible by 5 heads"):
        clip_config_from_open_clip(open_clip, vision_heads=5, text_heads=4)


def test_checkpoint_file_forms(tiny, tmp_path):
    _, _, open_clip = tiny
    torch.save({"state_dict": open_clip, "epoch": 3}, tmp_path / "hps.pt")  # HPSv2's layout
    torch.save(open_clip, tmp_path / "bare.pt")
    for name in ("hps.pt", "bare.pt"):
        loaded = load_open_clip_state_dict(tmp_path / name)
        assert set(loaded) == set(open_clip) and torch.equal(loaded["visual.proj"], open_clip["visual.proj"])
    torch.save({"state_dict": [1, 2]}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="no open_clip state dict"):
        load_open_clip_state_dict(tmp_path / "bad.pt")


def test_conversion_script_writes_a_folder_that_scores_like_the_checkpoint(tiny, tmp_path):
    from flowrl.rewards.hps import HPSv2

    model, _, open_clip = tiny
    processor_dir = save_tiny_clip(tmp_path / "processor")
    torch.save({"state_dict": open_clip}, tmp_path / "HPS_tiny.pt")
    spec = importlib.util.spec_from_file_location("convert_hps_checkpoint", ROOT / "scripts/convert_hps_checkpoint.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = script.main(["--checkpoint", str(tmp_path / "HPS_tiny.pt"), "--processor", str(processor_dir),
                       "--output", str(tmp_path / "hps-tiny"), "--vision-heads", "4", "--text-heads", "4"])
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()

    images, prompts = torch.rand(3, 3, 40, 28), ["a red cat", "dog", "red"]
    from_folder = HPSv2(model=str(out), processor=None).score(images, prompts)
    from_file = HPSv2(model=str(tmp_path / "HPS_tiny.pt"), processor=str(processor_dir), vision_heads=4,
                      text_heads=4).score(images, prompts)
    assert torch.equal(from_folder, from_file)
    with pytest.raises(FileNotFoundError, match="org/repo/filename"):
        script.main(["--checkpoint", str(tmp_path / "missing.pt"), "--output", str(tmp_path / "x")])
