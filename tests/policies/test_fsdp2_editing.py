"""FSDP2 on the tiny FLUX.1 Kontext pipeline (2 CPU processes): the sharding plan of ``FluxTransformer2DModel`` with
the source tokens appended at every call gives the same advantages, an on-policy first update and the same LoRA
weights as a 1-process run; a batch whose sources have several token layouts (one transformer call each) is refused
under FSDP2, where every call is a collective."""

import pytest
import torch

from flowrl.cli import main
from flowrl.policies.source_latents import by_layout
from tests.cli.test_fit import assert_two_ranks_equal_one, run_cli
from tests.policies.edit_records import write_records
from tests.policies.test_edit_fits import edit_args
from tests.policies.test_fsdp2_pipeline import COMMON
from tests.policies.test_sd3 import metrics


def args(model_dir, out, records, *extra):
    return edit_args("kontext", model_dir, out, records, *COMMON, f"--trainer.callbacks.out={out}/dump", *extra)


def test_fsdp2_kontext_lora_equals_one_process(flux_kontext_dir, tmp_path):
    records = write_records(tmp_path / "data", sizes=((40, 48),) * 3)  # one source layout on every rank
    main(args(flux_kontext_dir, tmp_path / "one", records))
    run_cli(args(flux_kontext_dir, tmp_path / "two", records, "--trainer.devices=2", "--trainer.strategy=fsdp2"),
            tmp_path)
    assert_two_ranks_equal_one(tmp_path / "one", tmp_path / "two")
    assert metrics(tmp_path / "two")["train/check_ratio_max_dev"] < 1e-5  # on-policy with sharded weights (fp32)


def test_several_source_layouts_are_refused_under_fsdp2():
    grid = torch.tensor([[[2, 2]], [[1, 4]]])
    run = lambda rows, layout: rows[:, None].float()  # noqa: E731
    assert by_layout(2, grid, run).tolist() == [[0.0], [1.0]]  # two calls without sharding
    with pytest.raises(ValueError, match="2 token layouts .* one aspect ratio"):
        by_layout(2, grid, run, sharded=True)
