"""The console of a run shows the run: the quickstart's first steps print the run's header and progress bar and no
warning, and the filters that keep framework notices off it are narrow (other warnings still show). Both read one
launched interpreter (the ``console`` fixture)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# one xdist worker runs this file (pytest's --dist loadgroup): its launched interpreter serves both tests
pytestmark = pytest.mark.xdist_group("console")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": ""}
KNOWN_NOISE = ("_pytree", "LeafSpec", "module(s) in eval mode", "requires torchvision", "Tip:", "litlogger",
               "all_gather is deprecated", "args parameter is intended")


# the warnings and log records the filters of flowrl.cli (warning_filters.py) drop, then some they must let through
PROBE = """
import logging, warnings
import flowrl.cli
warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
warnings.warn("torch.distributed.nn.functional.all_gather is deprecated, use ...", FutureWarning)
warnings.warn("Found 181 module(s) in eval mode at the start of training. This may ...", UserWarning)
logging.getLogger("transformers.utils.import_utils").warning(
    "`X` requires torchvision (not installed); falling back to Y")
logging.getLogger("lightning.pytorch.utilities.rank_zero").warning("💡 Tip: For seamless cloud logging ...")
warnings.warn("torch.distributed.nn.functional.all_reduce is deprecated, use ...", FutureWarning)
warnings.warn("a warning of the user's own", UserWarning)
logging.getLogger("lightning.pytorch.utilities.rank_zero").warning("a Lightning message about the run")
"""
MARK = "==== python -m flowrl fit ===="


@pytest.fixture(scope="module")
def console(tmp_path_factory) -> tuple[str, str, Path]:
    """One launched interpreter serves both tests (its imports of Lightning, diffusers and transformers are most of
    what a tiny run costs): it imports ``flowrl.cli`` alone and raises :data:`PROBE`, prints :data:`MARK`, then runs
    the quickstart's first 2 steps as ``python -m flowrl fit`` does (``runpy``, as ``-m`` runs a package). One
    stream, unbuffered: the lines in the order a terminal shows them. Returns what came before the mark, what came
    after it, and the run's folder."""
    out = tmp_path_factory.mktemp("console")
    args = ["fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps=2", f"--trainer.default_root_dir={out}",
            "--data.num_groups=2", "--data.group_size=4", "--data.val_prompts=[red 3 and blue 7]"]
    code = (f"{PROBE}\nprint({MARK!r}, flush=True)\nimport runpy, sys\nsys.argv = ['flowrl', *{args!r}]\n"
            "runpy.run_module('flowrl', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**ENV, "PYTHONUNBUFFERED": "1"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count(MARK) == 1, proc.stdout[-3000:]
    probe, run = proc.stdout.split(MARK)
    return probe, run, out


def test_quickstart_first_steps_show_the_run_and_no_warning(console):
    _, console, tmp_path = console
    warnings = [line for line in console.splitlines() if "warn" in line.lower()]
    assert warnings == []
    assert [noise for noise in KNOWN_NOISE if noise in console] == []
    assert "Loading weights from local directory" not in console  # huggingface_hub's print for the reward's folder
    header = console[console.index("flowrl fit: FlowGRPO on TinyFlowPolicy (flowrl/tiny-digits-gd3), LoRA rank 32"):]
    for line in ("rewards:     digit_alignment x 1", "batch:       2 prompts x 4 samples = 8 per batch on 1 process",
                 "run:         2 optimizer steps", f"logs:        {tmp_path}/quickstart/version_0 (TensorBoard, "
                 "metrics.csv)", "eval mode:   147 modules as loaded"):
        assert line in header.split("steps:")[0], line  # before the progress bar starts
    assert "steps: 100%" in console and "reward/total=" in console
    assert "flowrl run summary" in console
    # the README's and Getting started's first screen: the same block, with the lines a run prints, in its order
    readme, started = first_screen(ROOT / "README.md"), first_screen(ROOT / "docs/getting-started.md")
    assert readme == started and readme[-1].startswith("steps: ")
    assert [label(line) for line in readme[:-1]] == [label(line) for line in screen_before_the_bar(console)]


def first_screen(page: Path) -> list[str]:
    """The lines of the first ``text`` block after the words "first screen" on a docs page."""
    text = page.read_text()
    block = text[text.index("```text\n", text.index("first screen")) + len("```text\n"):]
    return block[:block.index("```")].rstrip("\n").split("\n")


def screen_before_the_bar(console: str) -> list[str]:
    """What a terminal shows above the training bar: each line's last carriage-return segment, a progress bar's
    refreshes as one line, without the validation bar (it clears itself when done)."""
    shown = []
    for line in console.split("\n"):
        segment = [part for part in line.split("\r") if part.strip()][-1:] or [""]
        if segment[0].startswith("steps:"):
            return shown
        if not segment[0].strip() or segment[0].startswith("validation"):
            continue
        if shown and "|" in segment[0] and label(shown[-1]) == label(segment[0]):
            shown[-1] = segment[0]  # a bar's refresh: a pipe gets it on a new line, a terminal over the old one
        else:
            shown.append(segment[0])
    raise AssertionError("no training progress bar in the console")


def label(line: str) -> str:
    """A console line's label: the text before its first colon ("  batch", "GPU available"), or the line."""
    return line.split(":")[0].rstrip()


def test_the_filters_hide_only_the_notices_they_name(console):
    shown = console[0]  # what the probe raised after importing flowrl.cli, before any run
    for hidden in ("LeafSpec", "all_gather is deprecated", "in eval mode", "requires torchvision", "Tip:"):
        assert hidden not in shown
    for kept in ("all_reduce is deprecated", "a warning of the user's own", "a Lightning message about the run"):
        assert kept in shown
