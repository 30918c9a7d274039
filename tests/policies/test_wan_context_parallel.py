"""Context parallelism (:mod:`flowrl.strategies.context_parallel`): 2 processes splitting one clip's tokens (Ulysses
attention over gloo, weights sharded by FSDP2 over the same mesh) give the velocity, the log-probabilities and the
LoRA gradients of 1 process; ring attention on 2 GPUs; bad settings refused before any weight loads."""

import pytest
import torch

from tests.policies.test_fsdp2_sharded_load import free_port
from tests.policies.wan_cp_ranks import run_rank


def split_equals_one(folder: str, out, attention: str, backend=None, tolerance: dict = None) -> None:
    torch.multiprocessing.spawn(run_rank, args=(folder, free_port(), str(out), attention, backend), nprocs=2)
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
