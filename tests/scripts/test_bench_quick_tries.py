"""scripts/bench_quick_tries.py without a fit: a runner injected in place of ``python -m flowrl fit`` sees the command
lines the bench builds, writes the metrics.csv a run would, and spends a little CPU in a real child process so the
bench's CPU seconds (the children's rusage, before and after) have something to count."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench_module():
    """scripts/bench_quick_tries.py as a module (it imports nothing of flowrl's: no Lightning to load here)."""
    spec = importlib.util.spec_from_file_location("bench_quick_tries", ROOT / "scripts" / "bench_quick_tries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_tiny_config_is_tried_with_its_documented_options_and_tabulated(tmp_path, capsys):
    bench, seen = bench_module(), {}

    def runner(cmd, env):
        config = cmd[cmd.index("--config") + 1]
        root = Path(next(a for a in cmd if a.startswith("--trainer.default_root_dir=")).split("=", 1)[1])
        seen[config] = (cmd, env["OMP_NUM_THREADS"])
        run = root / "tiny" / "version_0"
        run.mkdir(parents=True)
        # 4 batches of 320 evaluations, DenseGRPO's first with its calibration; the validations log no evaluations
        first = 320 + (520 if "dense" in config else 0)
        (run / "metrics.csv").write_text("step,rollout/evaluations,val/reward/total\n0,,0.4\n"
                                         f"0,{first},\n1,320,\n2,320,\n3,320,\n3,,0.5\n")
        subprocess.run([sys.executable, "-c", "sum(range(1_000_000))"], check=True)  # ~0.05 CPU s in a child
        return (1, "Traceback\nValueError: bad option") if "awm" in config else (0, "")

    rows = {r["config"]: r for r in bench.main([], runner=runner)}
    tiny = sorted(p.stem for p in (ROOT / "configs").glob("tiny_*.yaml"))
    assert sorted(rows) == tiny and sorted(seen) == [f"configs/{name}.yaml" for name in tiny]  # a row each
    dense, _ = seen["configs/tiny_dense_grpo.yaml"]
    assert dense[dense.index("fit"):dense.index("--config")] == ["fit"]
    assert dense[dense.index("--config") + 2:-1] == [
        "--trainer.max_steps=4", "--data.val_limit=8", "--model.init_args.calibration.samples=8",
        "--model.init_args.calibration.iterations=1"]
    flow, threads = seen["configs/tiny_flow_grpo.yaml"]
    assert flow[flow.index("--config") + 2:-1] == ["--trainer.max_steps=4", "--data.val_limit=8"] and threads == "1"
    assert (rows["tiny_dense_grpo"]["batches"], rows["tiny_dense_grpo"]["evaluations"]) == (4, 1800)  # 4 x 320 + 520
    assert rows["tiny_flow_grpo"]["evaluations"] == 1280 and rows["tiny_flow_grpo"]["cpu_s"] > 0.02
    out = capsys.readouterr().out
    assert "| tiny_dense_grpo | ok | 4 | 1,800 |" in out and "| tiny_awm | failed | 4 | 1,280 |" in out
    assert "ValueError: bad option" in out and out.startswith("load average at start:")
    assert "load average at end:" in out
