"""One 2-step fit of the embedded model on a gameable reward (mean brightness), shared by the evaluation tests, and
an untrained LoRA folder (the base model's images, exactly); a 16-prompt slice of the ``digits_val`` suite."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


BRIGHT = ["fit", "--config", "tests/evaluation/fit_brightness.yaml", "--trainer.max_steps=2"]  # from ROOT


def bright_fit_args(out: Path) -> list[str]:
    """``fit_brightness.yaml`` for 2 optimizer steps into ``out`` (run from the repository: its prompt files are
    relative to it); its checkpoint is ``out/checkpoints/last.ckpt``."""
    return [*BRIGHT, f"--trainer.default_root_dir={out}"]


def save_untrained_lora(folder: Path) -> Path:
    """A LoRA folder without adapter metadata (``save_adapter``) whose B matrices are zero: the base model."""
    from flowrl.policies import LoraOptions, TinyFlowPolicy
    from flowrl.policies.adapter_weights import save_adapter

    save_adapter(TinyFlowPolicy(lora=LoraOptions(rank=8, alpha=16)).load(), "default", folder)
    return folder


def save_suite16(file: Path) -> Path:
    """The first 16 prompts of the ``digits_val`` suite, written to ``file``."""
    from flowrl.evaluation.suites import NAMED

    file.write_text("".join((NAMED / "digits_val.jsonl").read_text().splitlines(keepends=True)[:16]))
    return file


@pytest.fixture(scope="session")
def bright_ckpt(tmp_path_factory) -> Path:
    """``last.ckpt`` of ``fit_brightness.yaml`` after 2 optimizer steps (enough to brighten the canvas and lose the
    digits: held-out alignment falls beyond its interval on 16 prompts x 2 seeds)."""
    import os

    from flowrl.cli import main

    out, cwd = tmp_path_factory.mktemp("bright"), os.getcwd()
    os.chdir(ROOT)  # the config's prompt files are relative to the repository
    try:
        main(bright_fit_args(out))
    finally:
        os.chdir(cwd)
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def untrained_lora(tmp_path_factory) -> Path:
    return save_untrained_lora(tmp_path_factory.mktemp("untrained"))


@pytest.fixture(scope="session")
def suite16(tmp_path_factory) -> Path:
    return save_suite16(tmp_path_factory.mktemp("suite") / "digits16.jsonl")


SEEDS, STEPS = [3, 11], 4


def evaluate_args(bright_ckpt, untrained_lora, suite16, out) -> list[str]:
    """The base, the brightness run and the untrained adapter on 16 prompts x 2 seeds, 4 ODE steps, batches of 8
    prompts."""
    return ["evaluate", "--ckpt_path", f"bright={bright_ckpt}", f"untrained={untrained_lora}", "--suite", str(suite16),
            "--seeds", *map(str, SEEDS), "--num_steps", str(STEPS), "--held_out", "flowrl.rewards.DigitAlignment",
            "--batch_size", "16", "--out", str(out), "--grid_prompts", "3", "--resamples", "2000",
            "--accelerator", "cpu"]


@pytest.fixture(scope="session")
def evaluated(bright_ckpt, untrained_lora, suite16, tmp_path_factory):
    """The report folder, and the initial noise of every ``generate`` call in order (base, bright, untrained per
    batch), recorded where the sampler draws it."""
    out = tmp_path_factory.mktemp("evaluated") / "report"
    import flowrl.sampling.sampler as sampler
    from flowrl.cli import main

    starts = []
    original = sampler.sample_from

    def recording(velocity, z, *args, **kwargs):
        starts.append(z.clone())
        return original(velocity, z, *args, **kwargs)

    sampler.sample_from = recording
    try:
        main(evaluate_args(bright_ckpt, untrained_lora, suite16, out))
    finally:
        sampler.sample_from = original
    return out, starts
