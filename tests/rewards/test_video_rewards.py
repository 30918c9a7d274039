"""Rewards on video: the frame reduction worked by hand on a small clip, metadata cut to each scoring chunk's rows,
the clip-level TemporalConsistency on constructed clips, VlmJudge's frame strip, and image rewards unchanged."""

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.rewards import JpegIncompressibility, TemporalConsistency
from flowrl.rewards.base import RewardCallback
from flowrl.rewards.pil_images import to_pil
from tests.rewards.test_vlm_judge import judge, server  # noqa: F401  the scripted judge and its fixture


class Brightness(RewardCallback):
    """The mean pixel of each image; records what each ``_score`` call received."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def _score(self, images, prompts, metadata):
        self.calls.append((images.shape, list(prompts), metadata))
        return images.mean(dim=(1, 2, 3))


def clip(batch=2, frames=5):
    """Clip ``b``'s frame ``f`` is filled with ``(10 b + f) / 100``."""
    values = (10 * torch.arange(batch)[:, None] + torch.arange(frames)[None]) / 100  # [B, F]
    return values[:, :, None, None, None].expand(batch, frames, 3, 2, 2).clone()


@pytest.mark.parametrize("frames, reduction, want", [
    ("first_middle_last", "mean", [(0 + 2 + 4) / 3, (10 + 12 + 14) / 3]),  # frames 0, (5 - 1) // 2, 4
    ("first_middle_last", "min", [0, 10]),
    ("all", "mean", [2, 12]),
    ("last", "mean", [4, 14]),
    ("every_3", "mean", [(0 + 3) / 2, (10 + 13) / 2]),  # frames 0, 3
    ([1, -1], "mean", [(1 + 4) / 2, (11 + 14) / 2]),
])
def test_an_image_reward_scores_the_picked_frames_and_reduces_them(frames, reduction, want):
    reward = Brightness(frames=frames, frame_reduction=reduction)
    scores = reward.score(clip(), ["a", "b"])
    assert torch.allclose(scores, torch.tensor(want) / 100)
    assert scores.shape == (2,)


def test_picked_frames_count_against_the_batch_size_with_prompts_repeated():
    reward = Brightness(batch_size=4)  # 3 frames per clip: 1 clip (3 images) per chunk
    reward.score(clip(batch=3), ["a", "b", "c"])
    assert [c[0][0] for c in reward.calls] == [3, 3, 3]
    assert [c[1] for c in reward.calls] == [["a"] * 3, ["b"] * 3, ["c"] * 3]
    reward = Brightness(batch_size=6)
    reward.score(clip(batch=3), ["a", "b", "c"])
    assert [c[1] for c in reward.calls] == [["a"] * 3 + ["b"] * 3, ["c"] * 3]


def test_per_row_metadata_is_cut_to_each_chunk_and_repeated_per_frame():
    metadata = {"seeds": torch.tensor([10, 11, 12, 13, 14]), "images": [[i] for i in range(5)], "scale": 2.0,
                "weights": torch.ones(3)}  # not per row: passes whole
    reward = Brightness(batch_size=2)
    reward.score(torch.rand(5, 3, 4, 4), list("abcde"), metadata)
    got = [(m["seeds"].tolist(), m["images"], m["scale"], m["weights"].shape[0]) for _, _, m in reward.calls]
    assert got == [([10, 11], [[0], [1]], 2.0, 3), ([12, 13], [[2], [3]], 2.0, 3), ([14], [[4]], 2.0, 3)]
    video = Brightness(batch_size=6, frames="first_middle_last")  # 2 clips x 3 frames per chunk
    video.score(clip(batch=3), list("abc"), {"seeds": torch.tensor([7, 8, 9]), "images": [["x"], ["y"], ["z"]]})
    first, second = (m for _, _, m in video.calls)
    assert first["seeds"].tolist() == [7, 7, 7, 8, 8, 8] and first["images"] == [["x"]] * 3 + [["y"]] * 3
    assert second["seeds"].tolist() == [9, 9, 9] and second["images"] == [["z"]] * 3


def test_bad_frame_options_fail_at_construction():
    with pytest.raises(ValueError, match="reward 'reward': frames='every_0'"):
        Brightness(frames="every_0")
    with pytest.raises(ValueError, match="frame_reduction='median'"):
        Brightness(frame_reduction="median")
    with pytest.raises(ValueError, match=r"indices \[7\] are outside a clip of 5 frames"):
        Brightness(frames=[0, 7]).score(clip(), ["a", "b"])


def test_existing_image_rewards_score_videos_as_the_mean_of_their_frames():
    torch.manual_seed(0)
    video = torch.rand(2, 5, 3, 16, 16)
    reward = JpegIncompressibility()
    frames = reward.score(video[:, [0, 2, 4]].flatten(0, 1), ["a"] * 6).view(2, 3)
    torch.testing.assert_close(reward.score(video, ["a", "b"]), frames.mean(1))
    assert reward.score(video[:, 0], ["a", "b"]).shape == (2,)  # images as before


def gradient_clip(frames=9, size=16):
    """A bar sliding one pixel per frame across a grey field: neighbouring frames differ by a little."""
    out = torch.full((frames, 3, size, size), 0.3)
    for f in range(frames):
        out[f, :, :, f:f + 4] = 0.9
    return out


def test_temporal_consistency_prefers_a_still_or_smooth_clip_to_a_shuffled_one():
    reward = TemporalConsistency(size=16)
    smooth = gradient_clip()
    shuffled = smooth[torch.tensor([0, 5, 2, 8, 1, 6, 3, 7, 4])]
    still = smooth[:1].expand(9, -1, -1, -1)
    scores = reward.score(torch.stack([still, smooth, shuffled]), ["a"] * 3)
    assert scores[0] == 1.0 and scores[0] > scores[1] > scores[2]
    # by hand: each move changes 2 columns of 16 by 0.6 in all rows and channels: 1 - 0.6 * 2 / 16 = 0.925
    assert scores[1].item() == pytest.approx(0.925)
    with pytest.raises(ValueError, match="needs clips .* at least 2"):
        reward.score(torch.rand(2, 3, 8, 8), ["a", "b"])  # images are one-frame clips


def test_vlm_judge_sends_a_frame_strip_of_a_video(server):  # noqa: F811
    torch.manual_seed(0)
    video = torch.rand(1, 5, 3, 8, 6)
    score = judge(server, image_size=8).score(video, ["a red cat"])
    assert score.tolist() == pytest.approx([4.5 / 5])
    strip = server.images["a red cat"]
    assert strip.shape == (8, 24, 3)  # frames 0, 2, 4 at 8 x 8, side by side
    for i, frame in enumerate((0, 2, 4)):
        want = np.asarray(to_pil(video[0, frame][None])[0].resize((8, 8), Image.BICUBIC))
        assert np.array_equal(strip[:, 8 * i:8 * (i + 1)], want)
    each = judge(server, image_size=None, video="frames", frames="all")
    assert each.score(video, ["a blue dog"]).tolist() == pytest.approx([2 / 5])
    assert server.attempts == 1 + 5  # one strip, then each of the 5 frames alone
    with pytest.raises(ValueError, match="video='gif'"):
        judge(server, video="gif")
