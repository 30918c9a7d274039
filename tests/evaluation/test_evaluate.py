"""``python -m flowrl evaluate`` end to end on the embedded model: the base, a 2-step fit trained on brightness (a
gameable reward) and an untrained LoRA folder, loaded as two adapters on one backbone. Every model starts each
(prompt, seed) from the same noise; the images are ``BaseModule.generate``'s; the flag is raised for the brightness
run (held-out digit alignment falls) and not for the untrained adapter; the report folder holds what it promises."""

import csv
import re

import numpy as np
import pytest
import torch
from PIL import Image

import flowrl.sampling.sampler as sampler
from flowrl.callbacks.image_writer import image_name
from flowrl.evaluation.suites import load_suite
from flowrl.methods import FlowGRPO
from flowrl.policies import TinyFlowPolicy
from flowrl.checkpoints.loading import load_policy
from flowrl.rewards import DigitAlignment

from tests.evaluation.conftest import SEEDS, STEPS

# one xdist worker runs this file (pytest's --dist loadgroup): the session's brightness fit and evaluation
# (tests/evaluation/conftest.py) is built once, not once per worker
pytestmark = pytest.mark.xdist_group("evaluation")


def scores(out) -> dict:
    with open(out / "scores.csv") as f:
        return {(r["model"], int(r["prompt_index"]), int(r["seed"]), r["metric"]): float(r["value"] or "nan")
                for r in csv.DictReader(f)}


def test_every_model_starts_each_prompt_and_seed_from_the_same_noise(evaluated, suite16):
    _, starts = evaluated
    # 16 prompts x 2 seeds in batches of 16 images (8 prompts): 2 batches x 3 models
    assert len(starts) == 6
    batches = [starts[i:i + 3] for i in (0, 3)]
    for base, bright, untrained in batches:
        assert torch.equal(base, bright) and torch.equal(base, untrained)
    # and that noise is a function of the seed alone: the rows of seed 3 are one tensor in every batch
    rows_of_seed_3 = torch.cat([b[0][0::2] for b in batches])  # rows alternate seeds 3, 11 within a prompt
    expected = sampler.seeded_noise(torch.tensor([3]), rows_of_seed_3.shape[1:], 1)[:, 0]
    assert all(torch.equal(row, expected[0]) for row in rows_of_seed_3)


def test_the_images_are_what_generate_draws_for_each_model(evaluated, bright_ckpt, suite16):
    out, _ = evaluated
    suite, _ = load_suite([str(suite16)])
    prompts = [p for p in suite.prompts[:4] for _ in SEEDS]
    seeds = torch.tensor(SEEDS * 4)
    base = FlowGRPO(TinyFlowPolicy(lora=None).load(), guidance_scale=4.5).generation.generate(prompts, seeds, STEPS)
    bright = FlowGRPO(load_policy(bright_ckpt), guidance_scale=4.5).generation.generate(prompts, seeds, STEPS)

    def written(model):
        files = [out / "images" / model / image_name(i // 2, p, s) for i, (p, s) in enumerate(zip(prompts,
                                                                                                  seeds.tolist()))]
        return torch.stack([torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1) for f in files])

    pixels = lambda images: (images.clamp(0, 1) * 255).round().to(torch.uint8)  # noqa: E731
    assert torch.equal(written("base"), pixels(base))
    assert torch.equal(written("bright"), pixels(bright))
    assert torch.equal(written("untrained"), pixels(base))  # zero LoRA: the base, exactly
    assert not torch.equal(pixels(bright), pixels(base))
    table = scores(out)
    expected = DigitAlignment().load("cpu").score(bright, prompts)
    got = torch.tensor([table["bright", i // 2, s, "digit_alignment"] for i, s in enumerate(seeds.tolist())])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_the_flag_is_raised_for_the_brightness_run_and_not_for_the_untrained_adapter(evaluated):
    out, _ = evaluated
    summary = {(r["section"], r["metric"], r["model"], r["category"]): r for r in csv.DictReader(
        open(out / "summary.csv"))}
    trained = summary["paired", "brightness", "bright", ""]
    held_out = summary["paired", "digit_alignment", "bright", ""]
    assert trained["kind"] == "trained" and float(trained["low"]) > 0
    assert held_out["kind"] == "held-out" and float(held_out["high"]) < 0
    report = (out / "report.md").read_text()
    assert "**bright: reward-hacking flag.**" in report
    assert "untrained: no flag (no trained reward rose beyond its interval)" in report
    for metric in ("brightness", "digit_alignment"):  # identical images: every paired change is exactly 0
        row = summary["paired", metric, "untrained", ""]
        assert float(row["difference"]) == float(row["low"]) == float(row["high"]) == 0.0
    assert all(v == 0.0 for (m, _, _, metric), v in scores(out).items()
               if m == "untrained" and metric.startswith("drift"))


def test_the_report_folder(evaluated, suite16):
    out, _ = evaluated
    table = scores(out)
    models, metrics = {k[0] for k in table}, {k[3] for k in table}
    assert models == {"base", "bright", "untrained"}
    assert metrics == {"brightness", "digit_alignment", "drift_pixels", "drift_features"}
    assert len(table) == 16 * 2 * (2 * 3 + 2 * 2)  # rewards for 3 models, drifts for the 2 tuned ones
    categories = {r["category"] for r in csv.DictReader(open(out / "scores.csv"))}
    assert categories == set(load_suite([str(suite16)])[0].categories) == {"two digits, two colours",
                                                                            "two digits, one colour"}
    html = (out / "report.html").read_text()
    assert not re.search(r'src="(?!data:)', html) and html.count("data:image/png;base64,") == 2  # offline
    for name in ("chart.png", "grid.png", "diversity.csv", "evaluation.json"):
        assert (out / name).is_file(), name
    grid = Image.open(out / "grid.png")
    assert grid.width > 2 * 3 * 112  # 2 seeds x 3 models side by side
    assert "## By category" in (out / "report.md").read_text()
