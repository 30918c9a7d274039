"""The quickstart figures the README and Getting started quote are the kept runs' (``docs/data/quickstart/``), as
``scripts/quickstart_seeds.py --report`` computes them: a rerun that changes the CSVs fails here until the docs say
what it measured. Its wall time (not in the metrics) is the one ``docs/data/recorded.csv`` keeps, on every page that
gives one, and the quick check's cost is the config's and the kept run's arithmetic."""

import csv
import subprocess
import sys
from pathlib import Path

import yaml

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
    assert f"is **{f['before']}** (ODE, 10 steps, without CFG" in started  # the quickstart's base model's


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


def flat(path: Path) -> str:
    return " ".join(path.read_text().replace("**", "").split())  # bold and line wraps aside


def test_every_page_gives_the_recorded_wall_time():
    with open(ROOT / "docs/data/recorded.csv", newline="") as f:
        (minutes,) = [float(r["value"]) for r in csv.DictReader(f) if r["run"] == "quickstart/seed2"]
    quoted = f"about {round(minutes)} minutes on 2 CPU cores"
    for page in ("README.md", "docs/getting-started.md", "docs/index.md", "docs/methods/flow-grpo.md",
                 "configs/quickstart.yaml"):
        assert quoted in flat(ROOT / page), page


def test_the_quick_check_costs_what_the_pages_say():
    config = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    with open(ROOT / "docs/data/quickstart/metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    per_batch = [float(r["rollout/evaluations"]) for r in rows if r["rollout/evaluations"]]  # sampling, per batch
    steps, interval = config["model"]["init_args"]["eval_num_steps"], config["trainer"]["val_check_interval"]
    prompts = [line for line in (ROOT / config["data"]["val_prompts"]).read_text().splitlines() if line.strip()]
    val_samples = len(prompts) * config["data"]["val_samples_per_prompt"]  # 128 x 4
    validations = [r for r in rows if r["val/reward/digit_alignment"]]
    assert len(validations) == 2 + len(per_batch) // interval  # before, every `interval` batches, after: 4
    full = (sum(per_batch), len(validations) * val_samples * steps)
    # the quick check: --trainer.max_steps=20 at 2 optimizer steps per batch, before and after on 16 x 1 samples
    batches = 20 // config["model"]["init_args"]["num_minibatches"]
    quick = (batches * per_batch[0], (2 + batches // interval) * 16 * 1 * steps)
    share = f"1/{round(sum(full) / sum(quick))} of"  # (69,120 + 20,480) / 8,000 = 11.2
    readme, started = flat(ROOT / "README.md"), flat(ROOT / "docs/getting-started.md")
    assert (f"{share} its model evaluations ({batches} batches instead of {len(per_batch)}, validation on 16 "
            f"samples instead of {val_samples})") in readme
    assert (f"{share} the quickstart's model evaluations: {batches} batches instead of {len(per_batch)} "
            f"({quick[0]:,.0f} evaluations instead of {full[0]:,.0f})") in started
    assert f"({quick[1]:,} evaluations instead of {full[1]:,})" in started
    command = "--trainer.max_steps=20 --data.val_limit=16 --data.val_samples_per_prompt=1"
    assert command in readme and command in started
