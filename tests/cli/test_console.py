"""The console of a run shows the run: the quickstart's first steps print the run's header and progress bar and no
warning, and the filters that keep framework notices off it are narrow (other warnings still show)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": ""}
KNOWN_NOISE = ("_pytree", "LeafSpec", "module(s) in eval mode", "requires torchvision", "Tip:", "litlogger",
               "all_gather is deprecated", "args parameter is intended")


def test_quickstart_first_steps_show_the_run_and_no_warning(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flowrl", "fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps=2",
         f"--trainer.default_root_dir={tmp_path}", "--data.num_groups=2", "--data.group_size=4",
         "--data.val_prompts=[red 3 and blue 7]"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-3000:]
    warnings = [line for line in console.splitlines() if "warn" in line.lower()]
    assert warnings == []
    assert [noise for noise in KNOWN_NOISE if noise in console] == []
    header = console[console.index("flowrl fit: FlowGRPO on TinyFlowPolicy (flowrl/tiny-digits), LoRA rank 32"):]
    for line in ("rewards:     digit_alignment x 1", "batch:       2 prompts x 4 samples = 8 per batch on 1 process",
                 "run:         2 optimizer steps", f"logs:        {tmp_path}/quickstart/version_0 (TensorBoard, "
                 "metrics.csv)", "eval mode:   181 modules as loaded"):
        assert line in header.split("steps:")[0], line  # before the progress bar starts
    assert "steps: 100%" in console and "reward/total=" in console
    assert "flowrl run summary" in console


def test_the_filters_hide_only_the_notices_they_name():
    code = """
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
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = proc.stdout + proc.stderr
    for hidden in ("LeafSpec", "all_gather is deprecated", "in eval mode", "requires torchvision", "Tip:"):
        assert hidden not in shown
    for kept in ("all_reduce is deprecated", "a warning of the user's own", "a Lightning message about the run"):
        assert kept in shown
