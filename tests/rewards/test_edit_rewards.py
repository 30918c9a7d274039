"""Edit rewards read each row's source images from ``metadata["images"]``: EditConsistency (pixels, hand-checked),
ImageSimilarity (flow_grpo's CLIP image cosine, against the published CLIP path on a tiny model), the VLM judge with
the sources before the edit, and the reward set's per-row metadata for ODE completions."""

import pytest
import torch

from flowrl.rewards import EditConsistency, ImageSimilarity, JpegIncompressibility, RewardSet
from flowrl.rewards.edit_consistency import kept_similarity
from tests.rewards.test_clip_rewards import reference_embeddings
from tests.rewards.test_vlm_judge import judge, server  # noqa: F401  (the fixture)
from tests.rewards.tiny_clip import save_tiny_clip


def test_edit_consistency_scores_what_the_edit_keeps_of_its_own_source():
    source = torch.zeros(3, 8, 8)
    edited = source.clone()
    edited[:, :4, :4] = 1.0  # a quarter of the picture repainted: the edited region
    reward = EditConsistency(size=4, edit_fraction=0.25)
    # 4 x 4 grid: the 4 changed cells (change 1) are the most-changed quarter and are left out; the rest kept: 1.0
    assert reward.score(edited[None], ["paint the corner white"], {"images": [[source]]}).tolist() == [1.0]
    # the whole picture: 1 - 4/16 = 0.75
    whole = EditConsistency(size=4, edit_fraction=0.0)
    assert whole.score(edited[None], ["paint the corner white"], {"images": [[source]]}).tolist() == [0.75]
    # the same output against another source scores otherwise: the reward is a function of output and source
    grey = torch.full((3, 16, 12), 0.5)  # another size: stretched to the output's frame
    assert reward.score(edited[None], ["x"], {"images": [[grey]]}).tolist() == [0.5]  # 12 kept cells changed by 0.5
    sources = [[source], [grey, source]]
    scores = EditConsistency(size=4, edit_fraction=0.25, source_index=-1).score(edited.expand(2, -1, -1, -1),
                                                                                ["a", "b"], {"images": sources})
    assert scores.tolist() == [1.0, 1.0]  # the last source of each record


def test_kept_similarity_by_hand():
    out, src = torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2, 2)
    out[0, 0] = torch.tensor([[0.3, 0.0], [0.0, 0.9]])  # channel means per cell: 0.1, 0, 0, 0.3
    # edit_fraction 0.25 drops the most-changed cell (0.3): 1 - (0.1 + 0 + 0) / 3
    torch.testing.assert_close(kept_similarity(out, src, 2, 0.25), torch.tensor([1 - 0.1 / 3]))


def test_edit_rewards_name_the_fix_without_sources():
    with pytest.raises(ValueError, match="compares each output with its prompt record.s source images"):
        EditConsistency().score(torch.rand(1, 3, 8, 8), ["x"], {"seeds": torch.tensor([1])})
    with pytest.raises(ValueError, match=r"source image 1 of each row, but some rows have \[1\] images"):
        EditConsistency(source_index=1).score(torch.rand(1, 3, 8, 8), ["x"], {"images": [[torch.rand(3, 8, 8)]]})
    with pytest.raises(ValueError, match=r"edit_fraction=1.0 must be in \[0, 1\)"):
        EditConsistency(edit_fraction=1.0)


def test_image_similarity_is_the_clip_cosine_of_output_and_source(tmp_path):
    path = str(save_tiny_clip(tmp_path / "clip"))
    reward = ImageSimilarity(model=path)
    gen = torch.Generator().manual_seed(0)
    outputs, sources = torch.rand(2, 3, 64, 64, generator=gen), torch.rand(2, 3, 64, 64, generator=gen)
    out, _, _ = reference_embeddings(path, outputs, ["a", "b"])  # the published path: PIL through the processor
    src, _, _ = reference_embeddings(path, sources, ["a", "b"])
    got = reward.score(outputs, ["a", "b"], {"images": [[sources[0]], [sources[1]]]})
    torch.testing.assert_close(got, (out * src).sum(-1), rtol=1e-5, atol=1e-5)
    same = reward.score(outputs, ["a", "b"], {"images": [[outputs[0]], [outputs[1]]]})
    torch.testing.assert_close(same, torch.ones(2), rtol=1e-5, atol=1e-5)


def test_vlm_judge_sends_the_sources_before_the_edit(server):  # noqa: F811
    server.replies["make it red"] = "Final Score: 4"
    source, edited = torch.rand(3, 24, 20), torch.rand(1, 3, 24, 20)
    scores = judge(server, image_size=None, edit=True).score(edited, ["make it red"], {"images": [[source]]})
    assert scores.tolist() == pytest.approx([0.8])
    sent = server.all_images["make it red"]
    assert len(sent) == 2 and (sent[0] == (source.permute(1, 2, 0) * 255).round().numpy()).all()
    assert (sent[1] == (edited[0].permute(1, 2, 0) * 255).round().numpy()).all()  # the edited image last
    assert "Instruction: [make it red]" in server.texts["make it red"]
    with pytest.raises(ValueError, match="source images, but the batch has none"):
        judge(server, edit=True).score(edited, ["make it red"])


def test_row_scorer_gives_each_completion_its_rows_metadata():
    seen = []

    class Recorder(JpegIncompressibility):
        def _score(self, images, prompts, metadata):
            seen.append(metadata)
            return torch.zeros(len(images))

    metadata = {"images": [["src0"], ["src1"]], "seeds": torch.tensor([7, 8]), "group_ids": torch.tensor([0, 1])}
    score = RewardSet([Recorder()]).row_scorer(metadata, 2)
    score(torch.rand(3, 3, 8, 8), ["b", "a", "b"], torch.tensor([1, 0, 1]))
    assert seen[0]["images"] == [["src1"], ["src0"], ["src1"]] and seen[0]["seeds"].tolist() == [8, 7, 8]
