"""Video samples people can look at: frame strips in the sample grid and predict's PNGs, animations beside them
(GIF with Pillow; MP4 with the optional imageio), and a clear error where MP4 is asked without it."""

import builtins
import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.callbacks import ImageWriter, SampleGrid
from flowrl.callbacks.video_samples import frame_strip


def videos(batch=2, frames=5, size=8):
    """Video ``b``'s frame ``f`` is grey level ``(40 b + 50 f) / 255``, so frames are told apart by their pixels."""
    levels = (40 * torch.arange(batch)[:, None] + 50 * torch.arange(frames)[None]).float() / 255
    return levels[:, :, None, None, None].expand(batch, frames, 3, size, size).clone()


def test_frame_strip_is_first_middle_and_last_side_by_side():
    strip = frame_strip(videos()[1])
    assert strip.shape == (3, 8, 24)
    assert [round(float(strip[0, 0, x]) * 255) for x in (0, 8, 16)] == [40, 40 + 100, 40 + 200]  # frames 0, 2, 4


def fake_trainer(tmp_path):
    return SimpleNamespace(fit_loop=SimpleNamespace(total_batch_idx=0), log_dir=str(tmp_path), default_root_dir=".",
                           is_global_zero=True, logger=None, global_step=0)


def test_sample_grid_shows_videos_as_strips_and_writes_an_animated_grid(tmp_path):
    outputs = {"images": videos(), "prompts": ["a cat", "a dog"], "rewards": torch.tensor([0.5, 0.25])}
    SampleGrid(every_n_steps=1, columns=2).on_train_batch_end(fake_trainer(tmp_path), None, outputs, None, 0)
    still = np.asarray(Image.open(tmp_path / "samples/step_000000.png"))
    assert still.shape == (96 + 26, 2 * 3 * 96, 3)  # one row of two strips, each three 96 px frames wide
    assert still[10, 96 + 10, 0] == 100 and still[10, 3 * 96 + 2 * 96 + 10, 0] == 40 + 200  # frame 2 of video 0 ...
    gif = Image.open(tmp_path / "samples/step_000000.gif")
    assert gif.n_frames == 5
    gif.seek(3)
    assert np.asarray(gif.convert("RGB"))[10, 96 + 10, 0] == 40 + 150  # frame 3 of video 1, animated
    images = {"images": torch.rand(2, 3, 8, 8), "prompts": ["a", "b"], "rewards": torch.zeros(2)}
    SampleGrid(every_n_steps=1).on_train_batch_end(fake_trainer(tmp_path / "img"), None, images, None, 0)
    assert sorted(p.name for p in (tmp_path / "img/samples").iterdir()) == ["step_000000.png"]  # images as before


def test_mp4_needs_imageio_and_says_how_to_get_it(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_imageio(name, *args, **kwargs):
        if name.startswith("imageio"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "__import__", no_imageio)
        with pytest.raises(ValueError, match=r"video_format='mp4' needs imageio .*pip install 'flowrl\[video\]'"):
            SampleGrid(video_format="mp4")
    with pytest.raises(ValueError, match="video_format='webm': choose one of"):
        ImageWriter(video_format="webm")


def test_mp4_animation_where_imageio_is_installed(tmp_path):
    iio = pytest.importorskip("imageio.v3", reason="the optional flowrl[video] extra")
    outputs = {"images": videos(size=9), "prompts": ["a", "b"], "rewards": torch.zeros(2)}  # odd sizes are padded
    SampleGrid(every_n_steps=1, video_format="mp4").on_train_batch_end(fake_trainer(tmp_path), None, outputs, None, 0)
    assert iio.imread(tmp_path / "samples/step_000000.mp4", plugin="FFMPEG").shape[0] == 5


def test_predict_writes_a_strip_and_an_animation_per_video(tmp_path, capsys):
    writer = ImageWriter(output_dir=str(tmp_path))
    trainer = SimpleNamespace(datamodule=SimpleNamespace(predict_seeds=[0]))
    writer.on_predict_start(trainer, None)
    prediction = {"images": videos(), "prompts": ["a cat", "a dog"], "seeds": torch.tensor([0, 0]),
                  "rows": torch.tensor([0, 1]), "rewards": {"temporal_consistency": torch.tensor([0.9, 0.8])}}
    writer.write_on_batch_end(trainer, None, prediction, None, None, 0)
    writer.on_predict_end(trainer, SimpleNamespace(eval_num_steps=4, guidance_scale=5.0))
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    assert rows[1]["file"] == "0001_a-dog_seed0.png" and rows[1]["video"] == "0001_a-dog_seed0.gif"
    assert float(rows[1]["temporal_consistency"]) == pytest.approx(0.8)
    assert np.asarray(Image.open(tmp_path / rows[1]["file"])).shape == (8, 24, 3)
    assert Image.open(tmp_path / rows[1]["video"]).n_frames == 5
    assert Path(tmp_path / "grid.png").is_file() and "2 videos of 2 prompts" in capsys.readouterr().out
