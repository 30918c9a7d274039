"""Context parallelism (:mod:`flowrl.strategies.context_parallel`): 2 processes splitting one clip's tokens (Ulysses
attention over gloo, weights sharded by FSDP2 over the same mesh) give the velocity, the log-probabilities and the
LoRA gradients of 1 process; ring attention on 2 GPUs; bad settings refused before any weight loads."""

import pytest
import torch

from tests.policies.test_fsdp2_sharded_load import free_port
from tests.policies.wan_cp_ranks import run_rank


def split_equals_one(folder: str, out, attention: str, backend=None, tolerance: dict = None) -> None:
    # fork on CPU: the processes start with diffusers and flowrl imported (spawn re-imports them, ~12 s of CPU each)
    torch.multiprocessing.start_processes(run_rank, args=(folder, free_port(), str(out), attention, backend),
                                          nprocs=2, start_method="spawn" if backend else "fork")
    ranks = [torch.load(out / f"rank{r}.pt") for r in (0, 1)]
    tolerance = tolerance or {"rtol": 1e-5, "atol": 1e-6}
    for r in ranks:
        assert r["models"] == 1 and r["tokens"] == 2  # the one expert of Wan 2.1, split over both processes
        assert r["divide"] and set(r["divide"]) == {1.0}  # one replica: FSDP2 sums the two halves' gradients
        one, split = r["one"], r["split"]
        torch.testing.assert_close(split["velocity"], one["velocity"], **tolerance)
        torch.testing.assert_close(split["log_prob"], one["log_prob"], **tolerance)
        assert split["grads"].keys() == one["grads"].keys() and len(one["grads"]) >= 8
        assert any(g.abs().sum() > 0 for g in one["grads"].values())  # LoRA B starts at zero, A's gradient then too
        for name, grad in one["grads"].items():
            torch.testing.assert_close(split["grads"][name], grad, **tolerance, msg=name)
    torch.testing.assert_close(ranks[0]["split"]["velocity"], ranks[1]["split"]["velocity"], rtol=0, atol=0)


def test_ulysses_on_two_cpu_processes_equals_one(wan_dirs, tmp_path):
    split_equals_one(wan_dirs["wan21"], tmp_path, "ulysses")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="ring attention needs 2 GPUs (a backend with log-sum-exp)")
def test_ring_on_two_gpus_equals_one(wan_dirs, tmp_path):
    split_equals_one(wan_dirs["wan21"], tmp_path, "ring", "_native_cudnn", {"rtol": 2e-2, "atol": 2e-3})


def built_wan(folder, **kw):
    from flowrl.policies import LoraOptions, WanPolicy
    from tests.policies.tiny_wan import FRAMES, SIZE

    return WanPolicy(folder, **{"lora": LoraOptions(rank=4), "height": SIZE, "width": SIZE, "num_frames": FRAMES,
                                "max_sequence_length": 16, **kw})


def test_the_split_sequence_is_the_clips_patch_tokens(wan_dirs, refuse_weights):
    from flowrl.policies.context_parallel import split_sequence

    # 9 frames at 32 x 32 px: latents of 3 frames (4x temporal) of 4 x 4 (8x spatial), patches 1 x 2 x 2: 3 x 2 x 2
    assert split_sequence(built_wan(wan_dirs["wan21"])) == (12, 2)
    assert split_sequence(built_wan(wan_dirs["wan21"], num_frames=17, height=64)) == (5 * 4 * 2, 2)


def test_bad_degrees_and_families_are_refused_before_loading(wan_dirs, sd3_dir, flux_dir, refuse_weights):
    from flowrl.policies import FluxPolicy, SD3Policy
    from flowrl.policies.context_parallel import context_parallel_problems

    wan = built_wan(wan_dirs["wan21"])
    assert context_parallel_problems(wan, 2, "ulysses", 2) == context_parallel_problems(wan, 2, "ring", 4) == []
    assert context_parallel_problems(wan, 1, "anything", 3) == []  # 1: no context parallelism
    three = "\n".join(context_parallel_problems(wan, 3, "ulysses", 2))
    assert "does not divide the 2 processes" in three and "2 attention heads" in three and "patch tokens" not in three
    assert context_parallel_problems(wan, 3, "ring", 3) == []  # ring splits no heads; 3 divides 12 tokens
    # 13 frames: 4 latent frames x 2 x 2 = 16 tokens, which 8 divides (12 do not)
    assert context_parallel_problems(built_wan(wan_dirs["wan21"], num_frames=13), 8, "ring", 8) == []
    assert "the clip's 12 patch tokens" in "\n".join(context_parallel_problems(wan, 8, "ring", 8))
    assert "choose among ['ulysses', 'ring']" in context_parallel_problems(wan, 2, "rings", 2)[0]
    (sd3,) = context_parallel_problems(SD3Policy(sd3_dir), 2, "ulysses", 2)
    assert "no context-parallel plan in diffusers (`_cp_plan`)" in sd3 and "context_parallel_size: 1" in sd3
    (flux,) = context_parallel_problems(FluxPolicy(flux_dir), 2, "ulysses", 2)
    assert "does not yet split FluxPolicy's sequence" in flux


def test_the_video_families_that_do_not_split_say_why_before_their_folder_exists():
    import diffusers

    from flowrl.cli.config_checks import policy_stand_in
    from flowrl.policies.context_parallel import context_parallel_problems

    def problems(policy: str) -> list[str]:  # the family alone: a hub config whose model is not here yet
        return context_parallel_problems(policy_stand_in({"class_path": f"flowrl.policies.{policy}"}), 2, "ulysses", 2)

    # LTX-2 has a plan in diffusers, but it splits the video and the prompt and leaves the audio stream whole
    plan = diffusers.LTX2VideoTransformer3DModel._cp_plan  # {module: {input: split} or the output's gather}
    assert not any("audio" in str(name) for module, splits in plan.items()
                   for name in [module, *(splits if isinstance(splits, dict) else [])])
    (ltx2,) = problems("LTX2Policy")
    assert "not split by flowrl" in ltx2 and "audio stream" in ltx2 and "context_parallel_size: 1" in ltx2
    assert diffusers.HunyuanVideo15Transformer3DModel._cp_plan is None  # a newer diffusers with one: wire it here
    for policy in ("HunyuanVideo15Policy", "HunyuanVideo15I2VPolicy"):
        (hunyuan,) = problems(policy)
        assert "(HunyuanVideo15Transformer3DModel) has no context-parallel plan in diffusers" in hunyuan, hunyuan
    assert problems("WanPolicy") == problems("WanI2VPolicy") == []  # split; its sizes are checked once built
