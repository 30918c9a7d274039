"""FSDP2 on the tiny FLUX.1 Kontext pipeline (2 CPU processes): the sharding plan of ``FluxTransformer2DModel`` with
the source tokens appended at every call gives the same advantages, an on-policy first update and the same LoRA
weights as a 1-process run; a batch whose sources have several token layouts (one transformer call each) is refused
under FSDP2, where every call is a collective."""

from pathlib import Path

import pytest
import torch

from flowrl.policies.source_latents import by_layout
from tests.cli.test_fit import assert_two_ranks_equal_one
from tests.policies.edit_records import write_records
from tests.policies.test_edit_fits import edit_args
from tests.policies.test_fsdp2_pipeline import COMMON
from tests.policies.test_sd3 import metrics
from tests.two_process_group import GROUP, module_folder


def args(model_dir, out, records, *extra):
    # one batch: the checks read the first step and the last weights
    return edit_args("kontext", model_dir, out, records, *COMMON, "--trainer.max_steps=1",
                     f"--trainer.callbacks.out={out}/dump", *extra)


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """FLUX.1 Kontext with LoRA on 1 process and on 2 under FSDP2, its records of one source layout on every rank
    (``tests/two_process_group.py``)."""
    records = write_records(folder / "data", sizes=((40, 48),) * 3)
    return ([args(models["flux_kontext"], folder / "one", records)],
            [args(models["flux_kontext"], folder / "two", records, "--trainer.devices=2", "--trainer.strategy=fsdp2")])


@GROUP
def test_fsdp2_kontext_lora_equals_one_process(two_process_fits):
    tmp_path = module_folder(two_process_fits, __name__)
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5  # on-policy with sharded weights (fp32)


def test_several_source_layouts_are_refused_under_fsdp2():
    grid = torch.tensor([[[2, 2]], [[1, 4]]])
    run = lambda rows, layout: rows[:, None].float()  # noqa: E731
    assert by_layout(2, grid, run).tolist() == [[0.0], [1.0]]  # two calls without sharding
    with pytest.raises(ValueError, match="2 token layouts .* one aspect ratio"):
        by_layout(2, grid, run, sharded=True)
