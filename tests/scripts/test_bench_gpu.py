"""scripts/bench_gpu.py runs its fits through the CLI and reports what it measured; on the CPU (no timings worth
reading) a smoke run checks the plumbing: one result per model, the right parameter counts, the on-policy check."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_on_cpu_reports_every_model(tmp_path):
    out = tmp_path / "results.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--models", "sd3", "sd15", "--steps", "2",
                    "--accelerator", "cpu", "--json", str(out)], cwd=ROOT, check=True, capture_output=True)
    results = json.loads(out.read_text())
    assert list(results) == ["sd3", "sd15"]

    sys.path.insert(0, str(ROOT))
    from tests.policies.tiny_pipelines import sd3_components

    transformer = sd3_components()["transformer"]
    assert results["sd3"]["params_m"] * 1e6 == sum(p.numel() for p in transformer.parameters())
    for r in results.values():
        assert 0 < r["trainable_m"] < r["params_m"]  # LoRA: a fraction of the denoiser
        assert r["first_s"] > 0 and r["median_s"] > 0
        assert r["ratio_dev"] < 1e-2  # the threshold the script sets for bf16
