"""What a tiny config costs, as its header says: "A full run" is the config's arithmetic (its batches times the
method's own ``rollout_cost``, DenseGRPO's calibration batch, each validation's prompts times its ODE steps), its
quick try is the options Getting started documents, and the page quotes the quick tries' times that
``docs/data/recorded.csv`` keeps with their machine and load."""

import csv
import importlib
from pathlib import Path

import pytest
import yaml

from flowrl.cli.config_checks import method_without_policy

ROOT = Path(__file__).resolve().parents[2]
TINY = sorted((ROOT / "configs").glob("tiny_*.yaml"))
QUICK = "--trainer.max_steps=4 --data.val_limit=8"
CALIBRATION = "--model.init_args.calibration.samples=8 --model.init_args.calibration.iterations=1"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("config", TINY, ids=[c.stem for c in TINY])
def test_the_header_says_what_a_full_run_costs_and_how_to_try_it(config):
    text = config.read_text()
    header = flat(" ".join(line.lstrip("#") for line in text.splitlines() if line.startswith("#")))
    cfg = yaml.safe_load(text)
    module, name = cfg["model"]["class_path"].rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    options = {k: v for k, v in cfg["model"]["init_args"].items() if k not in ("policy", "optimizer", "seed")}
    samples, evaluations = method_without_policy(cls, options).rollout_cost()  # of one seed's rollout
    per_batch = cfg["data"]["num_groups"] * cfg["data"]["group_size"] // samples * evaluations
    batches = cfg["trainer"]["max_steps"] // (options.get("num_inner_epochs", 1) * options.get("num_minibatches", 1))
    prompts = len([line for line in (ROOT / cfg["data"]["val_prompts"]).read_text().splitlines() if line.strip()])
    steps = options.get("eval_num_steps") or options["num_steps"]
    assert f"A full run: {batches} batches x {per_batch:,} = {batches * per_batch:,} model evaluations" in header
    assert f"{prompts * steps:,} per validation ({prompts} prompts x {steps} ODE steps" in header
    calibration = options.get("calibration")
    if calibration:  # DenseGRPO: the first batch's calibration runs whole trajectories (samples x iterations)
        per = calibration["samples"] * calibration["iterations"]
        assert (f"{per * evaluations:,} more in the first batch's calibration ({calibration['samples']} samples x "
                f"{calibration['iterations']} iterations x {evaluations})") in header
    quick = f"{QUICK} {CALIBRATION}" if calibration else QUICK
    assert f"Quick try (about a minute on a laptop; docs/getting-started.md): {quick}" in header


def test_getting_started_documents_the_quick_try_and_quotes_its_recorded_times():
    started = flat((ROOT / "docs/getting-started.md").read_text())
    assert f"`{QUICK}`" in started and f"`{CALIBRATION}`" in started
    with open(ROOT / "docs/data/recorded.csv", newline="") as f:
        rows = {(r["quantity"], r["run"]): r["value"] for r in csv.DictReader(f) if r["run"].startswith("quick_try/")}
    configs = {run for _, run in rows}
    assert configs  # at least one quick try is measured
    for run in configs:
        cpu, wall = rows["cpu_seconds", run], rows["wall_seconds", run]
        assert f"`configs/{run.split('/')[1]}.yaml` with its" in started, run
        assert f"{cpu} s of CPU time ({wall} s wall under that load)" in started.replace("**", ""), run
