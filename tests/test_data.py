"""Prompt loading, the group sampler across ranks, and the resumable loader."""

import json
from collections import Counter

import pytest
import torch

from flowrl.data import GroupBatchLoader, GroupLayout, PromptDataModule, eval_batches, group_batch, load_prompts


def test_load_prompts_from_list_txt_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text("red 1 and blue 2\n\n green 3 and red 4 \n")
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in ["a", "b"]))
    assert load_prompts(str(tmp_path / "p.txt")) == ["red 1 and blue 2", "green 3 and red 4"]
    assert load_prompts(str(tmp_path / "p.jsonl")) == ["a", "b"]
    assert load_prompts(["x"]) == ["x"]


def test_bad_prompt_sources_are_clear(tmp_path):
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="no prompts found"):
        load_prompts(str(tmp_path / "empty.txt"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_prompts(str(tmp_path / "missing.txt"))


@pytest.mark.parametrize("spread", [True, False])
def test_two_ranks_split_exactly_the_one_rank_batch(spread):
    one = GroupLayout(num_prompts=10, num_groups=4, group_size=3, world_size=1, spread=spread, seed=5)
    two = GroupLayout(num_prompts=10, num_groups=4, group_size=3, world_size=2, spread=spread, seed=5)
    full = group_batch(one, epoch=1, index=2, rank=0)
    parts = [group_batch(two, epoch=1, index=2, rank=r) for r in (0, 1)]
    for key in ("prompt_ids", "group_ids", "seeds"):
        assert torch.equal(torch.cat([p[key] for p in parts]).sort().values, full[key].sort().values)
    # every group holds one prompt, group_size times; ids are global: batch counter 1*3+2=5 -> ids 20..23
    counts = Counter(full["group_ids"].tolist())
    assert sorted(counts) == [20, 21, 22, 23] and set(counts.values()) == {3}
    for gid in counts:
        assert full["prompt_ids"][full["group_ids"] == gid].unique().numel() == 1
    if not spread:  # whole groups stay on one rank
        assert not set(parts[0]["group_ids"].tolist()) & set(parts[1]["group_ids"].tolist())
    assert full["seeds"].unique().numel() == 12


def test_epoch_covers_every_prompt():
    layout = GroupLayout(num_prompts=8, num_groups=2, group_size=2)
    seen = torch.cat([group_batch(layout, 0, i, 0)["prompt_ids"] for i in range(layout.batches_per_epoch)])
    assert sorted(seen.unique().tolist()) == list(range(8))


def test_layout_problems_are_named():
    assert "group_size=1" in GroupLayout(4, 2, 1).problems()[0]
    assert GroupLayout(4, 2, 1).problems(min_group_size=1) == []  # a method growing one tree per prompt
    assert "not divisible by the 2 ranks" in GroupLayout(4, 3, 3, world_size=2).problems()[0]
    with pytest.raises(ValueError, match="group_size=0"):
        PromptDataModule(prompts=["a"], group_size=0)


def test_eval_samples_per_prompt_on_two_ranks_cover_each_prompt_k_times_with_distinct_seeds():
    prompts = [f"p{i}" for i in range(5)]
    one = [row for b in eval_batches(prompts, 1, 4, 100) for row in zip(b["prompts"], b["seeds"].tolist())]
    ranks = [[row for b in eval_batches(prompts, 3, 4, 100, rank, 2) for row in zip(b["prompts"], b["seeds"].tolist())]
             for rank in (0, 1)]
    rows = ranks[0] + ranks[1]
    assert not set(ranks[0]) & set(ranks[1]) and len(rows) == 15
    assert Counter(p for p, _ in rows) == {p: 3 for p in prompts}
    assert len({seed for _, seed in rows}) == 15
    assert set(one) <= set(rows)  # the first sample of each prompt keeps the seed it has with one sample per prompt
    assert all(len(b["prompts"]) <= 4 for b in eval_batches(prompts, 3, 4, 100))
    with pytest.raises(ValueError, match="val_samples_per_prompt=0"):
        PromptDataModule(prompts=["a"], val_samples_per_prompt=0)


def test_loader_resumes_after_the_consumed_batches():
    layout = GroupLayout(num_prompts=12, num_groups=2, group_size=2, seed=1)  # 6 batches per epoch
    processed = [20]  # the trainer has processed 20 batches: epoch 3, batch 2
    loader = GroupBatchLoader([str(i) for i in range(12)], layout, rank=0, consumed=lambda: processed[0])
    it = iter(loader)
    batches = [next(it), next(it), next(it)]  # the trainer processed two; the fetcher read a third ahead
    assert torch.equal(batches[0]["seeds"], group_batch(layout, 3, 2, 0)["seeds"])
    processed[0] = 22
    state = loader.state_dict()
    assert state == {"position": 22}
    fresh = GroupBatchLoader([str(i) for i in range(12)], layout, rank=0)
    fresh.load_state_dict(state)
    assert torch.equal(next(iter(fresh))["seeds"], batches[2]["seeds"])
    assert fresh.state_dict() == {"position": 23}  # without a trainer: the batches handed out
    old = GroupBatchLoader([str(i) for i in range(12)], layout, rank=0)
    old.load_state_dict({"epoch": 3, "consumed": 4})  # a checkpoint of the per-epoch format
    assert torch.equal(next(iter(old))["seeds"], group_batch(layout, 3, 4, 0)["seeds"])


def test_an_iteration_continues_the_epoch_of_the_position_whatever_lightning_counts():
    layout = GroupLayout(num_prompts=4, num_groups=2, group_size=2, seed=1)  # 2 batches per epoch
    processed = [3]  # Lightning cut an epoch short after one batch (a resumed run's first epoch)
    loader = GroupBatchLoader([str(i) for i in range(4)], layout, rank=0, consumed=lambda: processed[0])
    assert [b["seeds"].tolist() for b in loader] == [group_batch(layout, 1, 1, 0)["seeds"].tolist()]


def test_val_limit_keeps_the_first_validation_prompts(tmp_path):
    source = tmp_path / "val.txt"
    source.write_text("".join(f"p{i}\n" for i in range(10)))
    data = PromptDataModule(prompts=["a"], val_prompts=str(source), val_limit=3, val_samples_per_prompt=2)
    data.setup("fit")
    assert data.val_prompts == ["p0", "p1", "p2"]
    assert sorted(p for b in data.val_dataloader() for p in b["prompts"]) == ["p0", "p0", "p1", "p1", "p2", "p2"]
    with pytest.raises(ValueError, match="val_limit=0: need at least 1"):
        PromptDataModule(prompts=["a"], val_limit=0)
