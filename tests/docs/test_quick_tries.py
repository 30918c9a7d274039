"""What a tiny config costs, as its header says: "A full run" is the config's arithmetic (its batches times the
method's own ``rollout_cost``, DenseGRPO's calibration batch, each validation's prompts times its ODE steps), its
quick try is the options of ``scripts/bench_quick_tries.py``'s table that Getting started documents, and the page's
table of quick tries gives every tiny config the CPU and wall seconds ``docs/data/recorded.csv`` keeps with their
machine and load (or says it is not measured)."""

import csv
import importlib
import importlib.util
from pathlib import Path

import pytest
import yaml

from flowrl.cli.config_checks import method_without_policy

ROOT = Path(__file__).resolve().parents[2]
TINY = sorted((ROOT / "configs").glob("tiny_*.yaml"))


def bench_module():
    """scripts/bench_quick_tries.py, whose table of quick-try options the configs and the page quote."""
    spec = importlib.util.spec_from_file_location("bench_quick_tries", ROOT / "scripts" / "bench_quick_tries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = bench_module()
QUICK = " ".join(BENCH.QUICK)


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
        assert config.stem in BENCH.EXTRA  # a calibration the quick try does not shrink would cost it minutes
    quick = " ".join(BENCH.quick_options(config.stem))
    assert f"Quick try (about a minute on a laptop; docs/getting-started.md): {quick}" in header


def test_getting_started_documents_the_quick_try_and_tabulates_every_tiny_configs_recorded_times():
    started = flat((ROOT / "docs/getting-started.md").read_text())
    assert f"`{QUICK}`" in started
    for name, extra in BENCH.EXTRA.items():
        assert f"`configs/{name}.yaml`" in started and f"`{' '.join(extra)}`" in started, name
    with open(ROOT / "docs/data/recorded.csv", newline="") as f:
        rows = {(r["quantity"], r["run"]): r["value"] for r in csv.DictReader(f) if r["run"].startswith("quick_try/")}
    assert {run.split("/")[1] for _, run in rows} <= {c.stem for c in TINY}
    for config in TINY:
        found = [line for line in started.split(" | `") if line.startswith(f"{config.stem}` |")]
        assert len(found) == 1, f"not one row of the quick tries' table for {config.stem}: {found}"
        row = found[0]
        run = f"quick_try/{config.stem}"
        if ("cpu_seconds", run) not in rows:
            assert "not measured" in row.split("|")[1], config.stem
            continue
        cells = [c.strip() for c in row.split("|")]
        assert cells[3:5] == [rows["cpu_seconds", run], rows["wall_seconds", run]], (config.stem, cells)
