"""Prompt records with images: the loader, the images every kind of batch carries (training, validation, predict),
and the pre-load check's errors naming the key, the file, the line and the fix."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.data import PromptDataModule
from flowrl.prompt_records import (PromptRecord, data_record_problems, load_image, load_records,
                                   prompt_record_problems, record_problems)


def png(path: Path, value: int, size=(24, 16)) -> Path:
    """A solid RGB image whose pixels are ``value`` (red), ``value // 2`` (green), 0 (blue)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    array[..., 0], array[..., 1] = value, value // 2
    Image.fromarray(array).save(path)
    return path


def jsonl(path: Path, rows: list) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def records_file(tmp_path):
    png(tmp_path / "frames/a.png", 200)
    png(tmp_path / "frames/b.png", 100)
    return jsonl(tmp_path / "p.jsonl", [{"prompt": "cat turns", "images": ["frames/a.png"]},
                                        {"prompt": "dog runs", "images": ["frames/b.png"]},
                                        {"prompt": "cat turns", "images": ["frames/b.png"]}])


def test_records_resolve_paths_from_the_files_folder_and_images_load_in_0_1(tmp_path, records_file):
    records = load_records(records_file)
    assert records[0] == PromptRecord("cat turns", (tmp_path / "frames/a.png",), 1, records_file)
    assert [r.line for r in records] == [1, 2, 3]
    image = load_image(records[0].images[0])
    assert image.shape == (3, 16, 24) and image.dtype == torch.float32
    assert torch.allclose(image[:, 0, 0], torch.tensor([200 / 255, 100 / 255, 0.0]))
    assert load_records(["a", "b"]) == [PromptRecord("a"), PromptRecord("b")]


def test_every_batch_carries_each_rows_own_prompts_images(records_file):
    data = PromptDataModule(records_file, val_prompts=records_file, group_size=2, num_groups=3, val_batch_size=2,
                            predict_prompts=records_file, predict_seeds=[0, 1])
    data.setup("fit")
    red = lambda images: round(float(images[0][0, 0, 0]) * 255)  # noqa: E731  the first image's red value
    want = {0: 200, 1: 100, 2: 100}  # record -> its image's red value (records 0 and 2 share a prompt)
    batch = next(iter(data.train_dataloader()))
    assert len(batch["images"]) == len(batch["prompts"]) == 6
    assert [red(i) for i in batch["images"]] == [want[p] for p in batch["prompt_ids"].tolist()]
    val = list(data.val_dataloader())
    assert [red(i) for b in val for i in b["images"]] == [200, 100, 100]
    data.setup("predict")
    rows = [row for b in data.predict_dataloader() for row in zip(b["prompts"], b["images"], b["seeds"].tolist())]
    assert [(p, red(i), s) for p, i, s in rows] == [("cat turns", 200, 0), ("cat turns", 200, 1), ("dog runs", 100, 0),
                                                    ("dog runs", 100, 1), ("cat turns", 100, 0), ("cat turns", 100, 1)]


def test_text_only_sources_give_batches_without_images(tmp_path):
    data = PromptDataModule(["a", "b"], val_prompts=["a"], group_size=2, num_groups=1)
    data.setup("fit")
    assert "images" not in next(iter(data.train_dataloader())) and "images" not in next(iter(data.val_dataloader()))


def test_missing_unreadable_and_miscounted_images_name_file_line_and_fix(tmp_path):
    png(tmp_path / "ok.png", 10)
    (tmp_path / "broken.png").write_text("not an image")
    source = jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "images": ["ok.png"]},
                                          {"prompt": "b", "images": ["missing.png"]},
                                          {"prompt": "c", "images": ["broken.png"]},
                                          {"prompt": "d", "images": ["ok.png", "ok.png"]},
                                          {"prompt": "e"}])
    problems = record_problems(source, "data.prompts", 1, "WanI2VPolicy")
    assert len(problems) == 3 + 1  # lines 2..5 (line 1 is fine)
    assert f"data.prompts={source} line 2: image '{tmp_path / 'missing.png'}' does not exist" in problems[0]
    assert "relative to the .jsonl file's folder" in problems[0]
    assert f"line 3: image '{tmp_path / 'broken.png'}' cannot be read as an image" in problems[1]
    assert "re-save it as PNG or JPEG" in problems[1]
    assert problems[2].endswith("line 4 has 2 images; WanI2VPolicy takes exactly 1 per prompt")
    assert problems[3].endswith("line 5 has 0 images; WanI2VPolicy takes exactly 1 per prompt")
    text_only = record_problems(source, "data.val_prompts", 0, "SD3Policy")
    assert text_only[0].startswith(f"data.val_prompts={source} line 1 has 1 images; SD3Policy takes none")
    assert "drop the \"images\" lists" in text_only[0]


def test_a_policy_that_takes_images_refuses_prompts_only_sources(tmp_path):
    (tmp_path / "p.txt").write_text("a cat\n")
    for source in (str(tmp_path / "p.txt"), ["a cat"]):
        problems = record_problems(source, "data.prompts", 1, "WanI2VPolicy")
        assert problems == ["data.prompts: WanI2VPolicy conditions every prompt on images, but data.prompts gives "
                            "prompts only; give a .jsonl file whose records carry an \"images\" list of paths"]
    assert record_problems(["a cat"], "data.prompts", 0, "SD3Policy") == []


def test_malformed_lines_are_each_named(tmp_path):
    source = jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"', {"text": "b"}, {"prompt": "c", "images": "c.png"}])
    problems = record_problems(source, "data.prompts", 1, "WanI2VPolicy")
    assert len(problems) == 1 and problems[0].startswith(f"data.prompts: prompt file {source}:")
    for text in ("line 1 is not JSON", "line 2 has no \"prompt\" string", "line 3: \"images\" must be a list"):
        assert text in problems[0]


def test_long_lists_of_problems_are_cut_with_a_count(tmp_path):
    source = jsonl(tmp_path / "p.jsonl", [{"prompt": str(i), "images": [f"{i}.png"]} for i in range(8)])
    problems = record_problems(source, "data.prompts", 1, "WanI2VPolicy")
    assert len(problems) == 6 and problems[-1] == "data.prompts: ... and 3 more such problems"


def test_the_pre_load_check_reads_a_parsed_data_config_and_the_policy_class_only(tmp_path, records_file):
    from flowrl.policies import SD3Policy, WanI2VPolicy

    data = {"prompts": records_file, "val_prompts": str(tmp_path / "not_there.jsonl"), "predict_prompts": None}
    assert prompt_record_problems(data, WanI2VPolicy.conditioning_images, "WanI2VPolicy") == []
    problems = prompt_record_problems(data, SD3Policy.conditioning_images, "SD3Policy")
    assert [p.split(" line ")[1][:1] for p in problems] == ["1", "2", "3"]  # every record names its line
    assert all(p.startswith(f"data.prompts={records_file}") for p in problems)


def test_the_built_data_module_is_checked_against_the_built_policys_images(tmp_path, records_file, tiny_model_dir):
    from flowrl.cli.config_checks import policy_stand_in
    from flowrl.data import PromptDataModule
    from flowrl.policies import TinyFlowPolicy

    data = PromptDataModule(prompts=records_file, val_prompts=["a cat"])
    unbuilt = policy_stand_in({"class_path": "flowrl.policies.WanPolicy", "init_args": {"model": "/no/such/model"}})
    problems = data_record_problems(data, unbuilt)  # a policy that could not be built: its class's count
    assert len(problems) == 3 and "WanPolicy takes none (text only)" in problems[0]
    policy = TinyFlowPolicy(tiny_model_dir)  # built from its configs alone: the instance's count is read
    assert len(data_record_problems(data, policy)) == 3
    policy.conditioning_images = 1  # as a Qwen-Image-Edit folder sets its own on the instance
    assert data_record_problems(data, policy) == [
        "data.val_prompts: TinyFlowPolicy conditions every prompt on images, but data.val_prompts gives prompts only; "
        "give a .jsonl file whose records carry an \"images\" list of paths"]
    assert data_record_problems(PromptDataModule(prompts=["a cat"]), policy_stand_in(None)) == []


def test_the_data_module_checks_records_against_the_policy_at_setup(tmp_path):
    source = jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "images": ["missing.png"]}])
    data = PromptDataModule(source, group_size=2, num_groups=1)
    policy = SimpleNamespace(conditioning_images=1)
    data.trainer = SimpleNamespace(lightning_module=SimpleNamespace(policy=policy, min_group_size=2), world_size=1,
                                   global_rank=0)
    with pytest.raises(ValueError, match=r"invalid prompt records:\n  data.prompts=.* line 1: image .* does not exist"):
        data.setup("fit")


def test_high_bit_and_palette_sources_read_as_their_pixels_not_clipped_to_white(tmp_path):
    grey = np.full((4, 6), 20000, np.uint16)  # mid-grey in 16 bits: convert("RGB") clipped it to 255 (white)
    Image.fromarray(grey).save(tmp_path / "i16.png")
    big_endian = Image.new("I;16B", (6, 4))
    big_endian.frombytes(grey.astype(">u2").tobytes())
    big_endian.save(tmp_path / "i16b.tif")
    Image.fromarray(grey.astype(np.int32)).save(tmp_path / "i32.tif")
    Image.fromarray(np.full((4, 6), 0.25, np.float32)).save(tmp_path / "f.tif")
    alpha = np.stack([np.full((4, 6), 100, np.uint8), np.full((4, 6), 50, np.uint8)], -1)
    Image.fromarray(alpha, "LA").save(tmp_path / "la.png")
    palette = Image.new("P", (6, 4))
    palette.putpalette([10, 20, 30, 200, 100, 50])
    palette.save(tmp_path / "p.png", transparency=0)
    modes = {name: Image.open(tmp_path / name).mode for name in ("i16.png", "i16b.tif", "i32.tif", "f.tif")}
    assert modes == {"i16.png": "I;16", "i16b.tif": "I;16B", "i32.tif": "I", "f.tif": "F"}
    want = {"i16.png": [20000 / 65535] * 3, "i16b.tif": [20000 / 65535] * 3, "i32.tif": [20000 / 65535] * 3,
            "f.tif": [0.25] * 3, "la.png": [100 / 255] * 3, "p.png": [10 / 255, 20 / 255, 30 / 255]}
    for name, rgb in want.items():
        image = load_image(tmp_path / name)
        assert image.shape == (3, 4, 6) and image.dtype == torch.float32, name
        assert torch.allclose(image, torch.tensor(rgb).view(3, 1, 1).expand(3, 4, 6), atol=1e-6), name


def test_a_source_that_cannot_be_decoded_is_named_before_loading_not_at_its_batch(tmp_path, monkeypatch):
    rng = np.random.RandomState(0)
    Image.fromarray(rng.randint(0, 255, (64, 64, 3), np.uint8)).save(tmp_path / "whole.jpg")
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) // 2])  # headers intact: Image.verify passes it
    png(tmp_path / "sliver.png", 10, size=(2, 40))
    png(tmp_path / "bomb.png", 10, size=(120, 120))
    # a 120 x 120 px source is over twice this limit: Pillow's bomb error, as for a real one at 179 million pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5000)
    source = jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "images": ["whole.jpg"]},
                                          {"prompt": "b", "images": ["cut.jpg"]},
                                          {"prompt": "c", "images": ["sliver.png"]},
                                          {"prompt": "d", "images": ["bomb.png"]}])
    problems = record_problems(source, "data.prompts", 1, "FluxKontextPolicy")
    assert len(problems) == 3, problems
    assert f"line 2: image '{tmp_path / 'cut.jpg'}' cannot be read as an image (image file is truncated" in problems[0]
    assert f"line 3: image '{tmp_path / 'sliver.png'}' is 2 x 40 px; a source needs at least 16 px" in problems[1]
    assert f"line 4: image '{tmp_path / 'bomb.png'}' is too large to decode safely" in problems[2]
    assert "re-save it smaller" in problems[2]


def test_a_source_broken_after_the_check_is_named_at_its_batch(records_file, tmp_path):
    data = PromptDataModule(records_file, group_size=2, num_groups=3)
    data.setup("fit")
    cut = (tmp_path / "frames/b.png").read_bytes()[:60]
    (tmp_path / "frames/b.png").write_bytes(cut)  # cut off after the check (the image of lines 2 and 3)
    with pytest.raises(OSError, match=rf"{records_file} line [23]: image '{tmp_path / 'frames/b.png'}' cannot be read "
                                      r"\(.*\); it was readable when the run started"):
        next(iter(data.train_dataloader()))
