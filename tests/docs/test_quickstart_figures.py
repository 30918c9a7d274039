"""The quickstart figures the README and Getting started quote are the kept runs' (``docs/data/quickstart/``), as
``scripts/quickstart_seeds.py --report`` computes them: a rerun that changes the CSVs fails here until the docs say
what it measured."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def report() -> dict[str, str]:
    out = subprocess.run([sys.executable, str(ROOT / "scripts/quickstart_seeds.py"), "--report",
                          str(ROOT / "docs/data/quickstart")], capture_output=True, text=True, timeout=120, check=True)
    return dict(line.split(": ", 1) for line in out.stdout.strip().splitlines())


def test_readme_and_getting_started_quote_the_kept_runs():
    f = report()
    band = f"{f['mean_after']} +- {f['std_after']} over seeds 0-2, {f['mean_headroom']} of the"
    readme = " ".join((ROOT / "README.md").read_text().split())  # figures may wrap across lines
    assert f"**{f['before']} -> {f['after']}** with the default seed ({band}" in readme
    started = " ".join((ROOT / "docs/getting-started.md").read_text().split())
    assert f"from **{f['before']} to {f['after']}** with the default seed ({band}" in started
    for name in ("digit_alignment", "total"):  # the run summary the page shows, 4 decimals as printed
        assert f"val {name}: {f['before4']} -> {f['after4']}" in started
    assert f"is **{f['before']}** (ODE, 10 steps, CFG 4.5)" in started  # the base model's alignment


def test_the_report_is_the_kept_files_arithmetic(tmp_path):
    def kept(name: str, before: float, after: float) -> None:
        (tmp_path / name).write_text("step,val/reward/digit_alignment,train/reward/total\n"
                                     f"0,{before},\n1,,0.5\n2,{after},\n")

    kept("metrics.csv", 0.40, 0.70)
    kept("metrics_seed1.csv", 0.42, 0.80)
    kept("metrics_seed2.csv", 0.44, 0.75)
    out = subprocess.run([sys.executable, str(ROOT / "scripts/quickstart_seeds.py"), "--report", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    f = dict(line.split(": ", 1) for line in out.strip().splitlines())
    # seed 0: (0.70 - 0.40) / (0.98 - 0.40) = 51.7%; mean after 0.75, sample std 0.05; mean before 0.42
    assert (f["before"], f["after"], f["mean_after"], f["std_after"]) == ("0.400", "0.700", "0.750", "0.050")
    assert (f["headroom"], f["mean_headroom"]) == ("52%", "59%")  # (0.75 - 0.42) / (0.98 - 0.42) = 58.9%
