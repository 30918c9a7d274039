"""scripts/bench_methods.py and scripts/compare_methods.py at the smallest size: the bench's NFE per prompt are each
method's by hand, and the comparison trains every method to its budget and tabulates the runs it wrote. Both run in
pytest's process: a launched one would spend more CPU on its imports (Lightning's, ~12 s) than on the tiny fits."""

import csv
import importlib.util
import sys
from pathlib import Path

from flowrl.cli import main as flowrl

ROOT = Path(__file__).resolve().parents[2]


def script(name: str):
    """``scripts/<name>.py`` as a module, registered under its name (a callback's class path may name it)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(name: str, args: list[str], capsys, monkeypatch) -> str:
    """What ``python scripts/<name>.py ARGS`` prints, run from the repository in this process."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delitem(sys.modules, name, raising=False)
    script(name).main(args)
    return capsys.readouterr().out


class InProcess:
    """A fit of compare_methods run here, in place of its launched ``python -m flowrl`` (same arguments)."""

    returncode = 0

    def __init__(self, args: list[str]):
        flowrl(args)

    def communicate(self) -> tuple[str, str]:
        return "", ""


def test_bench_reports_each_methods_evaluations(tmp_path, capsys, monkeypatch):
    table = run("bench_methods", ["--prompts", "1", "--batches", "2", "--out", str(tmp_path), "--methods", "Flow-GRPO",
                                  "BranchGRPO"], capsys, monkeypatch)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| ") and "---" not in line and "method" not in line}
    assert rows["Flow-GRPO"][:3] == ["8", "80", "10.00"]  # 8 samples x 10 steps per prompt
    # splits at 0, 2, 4, 6 of 10: frontier sizes 1, 2, 2, 4, 4, 8, 8, 16, 16, 16 -> 77 evaluations, 16 leaves
    assert rows["BranchGRPO"][:3] == ["16", "77", "4.81"]
    assert float(rows["BranchGRPO"][6]) <= 1.2  # the tree's buffer against the unique latents it holds


def test_compare_trains_each_method_to_its_budget_and_tabulates(tmp_path, capfd, monkeypatch):
    # one method at its config's settings and one variant of another: 2 probes and 2 runs (a second method at its
    # settings would only repeat the first's path); a budget of one BranchGRPO batch, which the variant overshoots;
    # the runs' files kept, then one reused after its check
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # as when run as a file: it imports compare_metrics beside it
    compare = script("compare_methods")
    monkeypatch.setattr(compare, "fit", lambda *run: InProcess(compare.fit_arguments(*run)))
    monkeypatch.chdir(ROOT)
    (tmp_path / "kept").mkdir()
    kept_args = ["--val-prompts", "[red 3 and blue 7, green 1 and red 2]", "--kept", str(tmp_path / "kept"),
                 "--tag", "t"]
    compare.main(["--budget", "77", "--prompts", "1", "--seeds", "0", "--methods", "BranchGRPO", "--out",
                  str(tmp_path), "--variant", "Flow-GRPO 5 steps=Flow-GRPO:--model.init_args.num_steps=5",
                  *kept_args])
    out = capfd.readouterr().out  # the table comes from plot_rewards.py's process
    assert "BranchGRPO: 77 evaluations per batch -> 1 batches" in out  # ceil(77 / 77)
    assert "Flow-GRPO 5 steps: 40 evaluations per batch -> 2 batches" in out  # a variant with its overrides
    assert (tmp_path / "methods.png").is_file() and "| BranchGRPO | 1 |" in out and "| Flow-GRPO 5 steps | 1 |" in out
    (metrics,) = (tmp_path / "tiny_branch_grpo" / "seed0").glob("*/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    assert sum(float(r["rollout/evaluations"]) for r in rows if r.get("rollout/evaluations")) == 77  # 1 x 77
    assert len([r for r in rows if r.get("val/reward/total")]) >= 2  # before and after
    (variant,) = (tmp_path / "tiny_flow_grpo__flow_grpo_5_steps" / "seed0").glob("*/version_*/metrics.csv")
    assert sum(float(r["rollout/evaluations"]) for r in csv.DictReader(variant.open())
               if r.get("rollout/evaluations")) == 80  # 2 batches x 40: the budget reached at the batch past it
    kept = tmp_path / "kept" / "branch_grpo_t_seed0.csv"
    assert kept.read_bytes() == metrics.read_bytes()
    assert (tmp_path / "kept" / "flow_grpo__flow_grpo_5_steps_t_seed0.csv").is_file()
    # the run gone, its kept file stands for it once its first batch reproduces (one short check run, no full one)
    metrics.parents[2].rename(tmp_path / "gone")
    compare.main(["--budget", "77", "--prompts", "1", "--seeds", "0", "--methods", "BranchGRPO", "--out",
                  str(tmp_path), "--check-batches", "1", *kept_args])
    again = capfd.readouterr().out
    assert "reproduced: BranchGRPO seed 0 (branch_grpo_t_seed0.csv)" in again and "done:" not in again
    (reused,) = (tmp_path / "tiny_branch_grpo" / "seed0").glob("*/version_*/metrics.csv")
    assert reused.read_bytes() == kept.read_bytes()
