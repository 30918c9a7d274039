"""``evaluate`` on 2 DDP processes writes the files 1 process writes: batches are the same whole prompts on any
number of ranks, each rank draws and scores its own, and rank zero gathers and writes. The 2-process evaluate runs in
the suite's one launched process group of 2-process runs (``tests/two_process_group.py``: Lightning's DDP makes the
group when the first run starts the second rank; this evaluate joins it), its 1-process reference and the
brightness fit it evaluates in pytest's process before it."""

from pathlib import Path

from tests.evaluation.conftest import bright_fit_args, evaluate_args, save_suite16, save_untrained_lora
from tests.two_process_group import GROUP, module_folder, output_of_the_group


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """The brightness fit and the 1-process evaluate of it, the base and an untrained LoRA on 16 prompts x 2 seeds
    (``tests/evaluation/conftest.py``); the same evaluate on 2 DDP processes (``tests/two_process_group.py``)."""
    folder.mkdir(parents=True, exist_ok=True)
    lora, suite = save_untrained_lora(folder / "untrained"), save_suite16(folder / "digits16.jsonl")
    ckpt = folder / "bright" / "checkpoints" / "last.ckpt"
    return ([bright_fit_args(folder / "bright"), evaluate_args(ckpt, lora, suite, folder / "one")],
            [[*evaluate_args(ckpt, lora, suite, folder / "two"), "--devices", "2", "--strategy", "ddp"]])


@GROUP
def test_two_processes_write_the_files_of_one(two_process_fits):
    one, two = (module_folder(two_process_fits, __name__) / name for name in ("one", "two"))
    assert output_of_the_group(two_process_fits).count("report:") == 1  # rank zero alone writes and prints
    for name in ("scores.csv", "diversity.csv", "summary.csv"):
        assert (two / name).read_text() == (one / name).read_text(), name
    # each rank wrote its own rows' images into rank zero's folder
    assert sorted(p.name for p in (two / "images" / "bright").iterdir()) == sorted(
        p.name for p in (one / "images" / "bright").iterdir())
    assert len(list((two / "images" / "bright").iterdir())) == 32
