"""scripts/bench_models.py: the buffer's bytes from known tensor sizes, the bare calls are the adapter's own model
calls, and one measurement per adapter at the smallest size has the reported structure."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from flowrl.sampling.rollout import Rollout

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_models.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module  # its dataclass looks the module up while being defined
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_models"]


def test_buffer_bytes_from_known_sizes(bench):
    # B=2, T=3, latents 1x2x2 float32: 2*4*4*4 = 128 bytes; log_probs 2*3*4 = 24; sigmas expanded from [4]: 16;
    # train_mask 2*3 bool: 6; group_ids, seeds and cond_rows 2 longs each: 48; rewards {"r": [2] float32}: 8
    rollout = Rollout(["a", "b"], torch.zeros(2).long(), torch.arange(2), torch.zeros(2, 4, 1, 2, 2),
                      torch.zeros(2, 3), torch.linspace(1, 0, 4).expand(2, -1), torch.ones(2, 3, dtype=torch.bool),
                      rewards={"r": torch.zeros(2)})
    assert bench.buffer_bytes(rollout) == 128 + 24 + 16 + 6 + 48 + 8
    assert bench.latent_bytes(2, 3, (1, 2, 2)) == 128
    # a view of a larger tensor costs the larger tensor; two views of one storage count once
    big = torch.zeros(4, 4, 1, 2, 2)
    rollout.latents, rollout.images = big[:2], big[2:]
    assert bench.buffer_bytes(rollout) == 256 + 24 + 16 + 6 + 48 + 8


@pytest.mark.parametrize("name", ["tiny", "sd3", "flux", "sd15", "qwen_image", "flux2", "zimage", "qwen_edit",
                                  "kontext", "wan21", "wan22"])
def test_bare_output_is_the_adapters_guided_output(bench, name, tmp_path):
    from scripts.bench_edit_calls import edit_images

    policy, make_bare, _, _ = bench.build_policy(name, tmp_path)
    prompts = ["a red cat", "a blue dog"]
    cond = policy.encode(prompts, images=edit_images(name, prompts))  # an edit's sources: one per record
    sigmas = policy.sigmas(3)
    bare = make_bare(policy, cond, sigmas, 3.0)
    z, k, rows = torch.randn(2, *policy.latent_shape()), torch.tensor([0, 2]), torch.tensor([1, 0])
    with torch.no_grad():
        want = policy.velocity(z, sigmas[k], cond.select(rows), 3.0)
        got = bare.output(bare.layout(z), k, rows)
    torch.testing.assert_close(got, bare.layout(want), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["tiny", "sd15", "kontext", "wan22"])
def test_measure_reports_every_field(bench, name, tmp_path):
    result = bench.measure(name, tmp_path, batch=2, steps=2, micro_batch=2, repeats=1)
    shape = result["latent_shape"]
    assert result["latent_bytes"] == 2 * 3 * torch.Size(shape).numel() * 4
    assert result["latent_bytes"] <= result["buffer_bytes"] <= 1.2 * result["latent_bytes"]
    assert result["pairs"] >= 1 and all(result[key] > 0 for key in
                                        ("rollout_flowrl", "rollout_bare", "train_flowrl", "train_bare"))
    text = bench.table([result])
    assert text.count("\n") == 2 and f"| {name} | {'x'.join(map(str, shape))} |" in text


def test_bad_sizes_are_refused_before_any_work(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--batch", "0"])
    assert "--batch=0 must be >= 1" in capsys.readouterr().err


def test_video_memory_rows_grow_with_frames_and_checkpointing_keeps_less(tmp_path):
    from scripts.bench_video_memory import memory_table, training_memory

    rows = training_memory(tmp_path, frames=(1, 5), size=32, pairs=2)
    assert [r["latent"][1] for r in rows] == [1, 2]  # (frames - 1) / 4 + 1 latent frames
    assert rows[1]["saved"] > rows[0]["saved"] > rows[0]["checkpointed"] > 0
    assert rows[1]["checkpointed"] > rows[0]["checkpointed"]
    # activation offload: the denoiser's saved tensors went to the host; what the pass still keeps is what it saves
    # outside the denoiser, less than even checkpointing keeps
    assert all(0 < r["kept"] < r["checkpointed"] and r["copied"] > r["saved"] / 2 for r in rows)
    text = memory_table(rows)
    assert text.count("\n| ") == 3 and "KiB per latent frame" in text


def test_video_memory_by_resolution_counts_the_transformers_tokens(tmp_path):
    from scripts.bench_video_memory import memory_table, resolution_memory

    rows = resolution_memory(tmp_path, sizes=(32, 64), frames=1, pairs=2)
    # 32 px / 8 (VAE) = 4 latent px, / 2 (patch) = 2 x 2 tokens; 64 px: 4 x 4; one latent frame
    assert [r["tokens"] for r in rows] == [4, 16] and rows[1]["saved"] > rows[0]["saved"]
    assert "KiB per token" in memory_table(rows, by="size")


def test_tree_storage_keeps_each_state_once(tmp_path):
    from scripts.bench_video_memory import tree_storage, tree_table

    rows = {(r["method"], r["branches"]): r for r in tree_storage(tmp_path, branches=(2, 3), steps=4)}
    for k in (2, 3):
        tempflow, tree_rpo = rows["TempFlow-GRPO", k], rows["Dynamic-TreeRPO", k]
        # TempFlow-GRPO, T=4: branch steps 0, 1, 2, k side branches each; the trunk's states z_0..z_3 and two per
        # leaf (its SDE step's result and its ODE completion's clean state)
        assert tempflow["leaves"] == 3 * k and tempflow["stored"] == 4 + 2 * tempflow["leaves"]
        # Dynamic-TreeRPO, window of steps 1 and 2: k^2 leaves; z_0, z_1, k children, k^2 grandchildren, k^2 clean
        # completions, the k^2 completed in one call
        assert tree_rpo["leaves"] == k * k and tree_rpo["stored"] == 2 + k + 2 * k * k and tree_rpo["widest"] == k * k
        for r in (tempflow, tree_rpo):
            assert r["stored"] == r["distinct"] and r["dense"] == r["leaves"] * 5 and r["stored"] < r["dense"]
    assert tree_table(list(rows.values())).count("\n| ") == 5


def test_chunking_frames_changes_the_velocity_and_chunking_rows_does_not(tmp_path):
    from scripts.bench_video_memory import chunking_change, chunking_table

    rows = chunking_change(tmp_path, frames=9, chunks=(1,))  # 3 latent frames
    assert [r["chunk"] for r in rows] == ["1 latent frame", "1 row (sample)"]
    assert rows[0]["norm"] > 1e-2 and rows[1]["frame_max"] < 1e-5
    assert chunking_table(rows).count("\n| ") == 3
