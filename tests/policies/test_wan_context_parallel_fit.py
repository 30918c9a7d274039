"""The training loop under context parallelism: 2 processes splitting each clip of the tiny Wan 2.1 pipeline
(``context_parallel_size: 2``, Ulysses over gloo, FSDP2 over the same mesh) are one data-parallel replica, so they
draw the batch, rewards and advantages of a 1-process fit, log its loss and model evaluations once, and end with its
LoRA weights (``tests/two_process_group.py``); and the collectives count a context-parallel group's processes as one
replica (:class:`~flowrl.methods.distributed.Ranks`, checked in-process with a stand-in trainer)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from tests.cli.test_fit import load_steps
from tests.policies.method_matrix import config
from tests.policies.test_fsdp2_pipeline import COMMON
from tests.policies.test_sd3 import metrics
from tests.two_process_group import GROUP, module_folder

SPLIT = ["--trainer.devices=2", "--trainer.strategy=flowrl.strategies.FSDP2Strategy",
         "--trainer.strategy.context_parallel_size=2", "--trainer.strategy.context_parallel_attention=ulysses"]


def args(model_dir: str, out: Path, *extra: str) -> list[str]:
    """Two batches of FlowGRPO (2 prompts x 2 samples) on the tiny Wan 2.1 clip (9 frames at 32 px: 12 patch tokens,
    2 heads), SGD with lr 1 so that the second batch samples from visibly trained weights."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config("flow_grpo", "wan", model_dir, out)))
    return ["fit", "--config", str(out / "config.yaml"), *COMMON, "--data.num_groups=2",
            f"--trainer.callbacks.out={out}/dump", *extra]


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """The tiny Wan 2.1 pipeline (written here: the group's models are image pipelines) on 1 process and split over
    2 (``tests/two_process_group.py``)."""
    from diffusers import WanPipeline

    from tests.policies.tiny_wan import save, wan21

    model = str(save(WanPipeline, wan21, folder / "wan21"))
    return [args(model, folder / "one")], [args(model, folder / "two", *SPLIT)]


@GROUP
def test_a_context_parallel_group_fits_as_one_process(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__)
    one, two = load_steps(tmp_path / "one"), load_steps(tmp_path / "two")
    for step in (0, 1):
        mine = one[f"step{step}_rank0"]
        ranks = [two[f"step{step}_rank{r}"] for r in (0, 1)]
        for key in ("seeds", "group_ids"):  # one replica: both processes draw the 1-process batch, row for row
            assert torch.equal(ranks[0][key], mine[key]) and torch.equal(ranks[1][key], mine[key]), (step, key)
        for key in ("rewards", "advantages"):  # the gathered output is whole on both: equal to the bit
            assert torch.equal(ranks[0][key], ranks[1][key]), (step, key)
            # measured equal to 1 process's too (the frames' JPEG sizes absorb the velocity's last bits)
            torch.testing.assert_close(ranks[0][key], mine[key], rtol=1e-5, atol=1e-6, msg=f"{step} {key}")
    logged_one, logged_two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    # counted once per replica: the 2 processes' rollouts are one batch's 4 samples x 3 steps
    assert logged_two["rollout/evaluations"] == logged_one["rollout/evaluations"] == 4 * 3
    # the loss is the same 0 on both (ratio 1, zero-mean advantages); its gradient is the sum of the two halves' token
    # shares, which float32 adds in another order: measured 1e-7 relative (1.9e-9 of 0.0186)
    for key in ("train/reward/total", "train/advantage/std", "train/grad_norm"):
        assert logged_two[key] == pytest.approx(logged_one[key], rel=1e-5, abs=1e-8), key
    assert logged_two["train/check_ratio_max_dev"] < 1e-5  # the split forward replays its own rollout's log-probs
    w1, w2 = torch.load(tmp_path / "one/dump/weights.pt"), torch.load(tmp_path / "two/dump/weights.pt")
    assert w1.keys() == w2.keys() and len(w1) >= 8
    for name, weight in w1.items():  # SGD with lr 1: the gradients' rounding, measured at most 2.1e-9 after 2 steps
        torch.testing.assert_close(w2[name], weight, rtol=1e-5, atol=1e-7, msg=name)
    assert any(not torch.equal(w, torch.zeros_like(w)) for k, w in w1.items() if "lora_B" in k)  # trained


def stand_in(rank: int, world: int, replicas: int) -> SimpleNamespace:
    """A trainer as the collectives read it: ``rank`` of ``world`` processes in ``replicas`` replicas."""
    degree = world // replicas
    return SimpleNamespace(world_size=world, global_rank=rank,
                           distributed_sampler_kwargs={"rank": rank // degree, "num_replicas": replicas})


def test_the_collectives_count_a_context_parallel_group_once():
    from flowrl.methods.distributed import Ranks

    # 4 processes in 2 groups of 2: processes 0, 1 hold replica 0's 3 rows, processes 2, 3 replica 1's 2 rows
    rows = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0]),
            torch.tensor([4.0, 5.0])]

    def all_gather(x):  # every process's tensor, padded as the collective pads it: [4, ...]
        return torch.stack([r if x.ndim == 0 else torch.cat([r, r.new_zeros(len(x) - len(r))])
                            for r in ([torch.tensor(len(r)) for r in rows] if x.ndim == 0 else rows)])

    ranks = [Ranks(stand_in(k, 4, 2), all_gather, torch.device("cpu")) for k in range(4)]
    sizes = ranks[3].rank_sizes(2)
    assert sizes == [3, 2]  # per replica, not [3, 3, 2, 2] per process
    assert ranks[3].gather(rows[3], sizes).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]  # each replica's rows once
    assert [r.rank_rows(sizes) for r in ranks] == [slice(0, 3), slice(0, 3), slice(3, 5), slice(3, 5)]
    assert [float(r.once(torch.tensor(7.0))) for r in ranks] == [7.0, 0.0, 7.0, 0.0]  # a sum counts 14, not 28
    assert [r.degree for r in ranks] == [2] * 4


def test_the_data_module_gives_a_context_parallel_group_one_batch():
    from flowrl.data import PromptDataModule

    batches = []
    for rank in range(4):  # 4 processes in 2 groups of 2
        data = PromptDataModule(["a", "b", "c", "d"], val_prompts=["e", "f", "g", "h"], group_size=2, num_groups=2,
                                val_batch_size=1)
        progress = SimpleNamespace(batch_progress=SimpleNamespace(total=SimpleNamespace(processed=0)))
        data.trainer = SimpleNamespace(**vars(stand_in(rank, 4, 2)), lightning_module=None,
                                       fit_loop=SimpleNamespace(epoch_loop=progress))
        data.setup("fit")
        batches.append((next(iter(data.train_dataloader())), [b["seeds"].tolist() for b in data.val_dataloader()]))
    assert batches[0][0]["seeds"].tolist() == batches[1][0]["seeds"].tolist() != batches[2][0]["seeds"].tolist()
    assert batches[2][0]["seeds"].tolist() == batches[3][0]["seeds"].tolist()
    assert len(batches[0][0]["seeds"]) == 2  # the batch's 4 rows over 2 replicas
    assert batches[0][1] == batches[1][1] and batches[0][1] != batches[2][1]  # validation rows per replica too
