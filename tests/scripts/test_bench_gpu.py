"""scripts/bench_gpu.py runs its fits through the CLI and reports what it measured; on the CPU (no timings worth
reading) a smoke run checks the plumbing: one result per model, the right parameter counts, the on-policy check, and
the current families' entries (Qwen-Image, Wan 2.1 with gradient checkpointing) through their ``--tiny`` pipelines."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 136 s of CPU for a benchmark script's plumbing; tests/scripts/test_gpu_pipelines.py stays default
def test_smoke_run_on_cpu_reports_every_model(tmp_path):
    out = tmp_path / "results.json"
    models = ["sd3", "sd15", "qwen_image", "wan21_ckpt"]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--models", *models, "--steps", "2",
                    "--tiny", "--accelerator", "cpu", "--json", str(out), "--workdir", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    results = json.loads(out.read_text())
    assert list(results) == models

    sys.path.insert(0, str(ROOT))
    from tests.policies.tiny_families import qwen_image_components
    from tests.policies.tiny_pipelines import sd3_components
    from tests.policies.tiny_wan import transformer as wan_transformer

    transformers = {"sd3": sd3_components()["transformer"], "qwen_image": qwen_image_components()["transformer"],
                    "wan21_ckpt": wan_transformer()}
    for name, transformer in transformers.items():
        assert round(results[name]["params_m"] * 1e6) == sum(p.numel() for p in transformer.parameters())
    for r in results.values():
        assert 0 < r["trainable_m"] < r["params_m"]  # LoRA: a fraction of the denoiser
        assert r["first_s"] > 0 and r["median_s"] > 0
        assert r["ratio_dev"] < 1e-2  # the threshold the script sets for bf16
