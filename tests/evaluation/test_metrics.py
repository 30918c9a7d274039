"""Which metrics an evaluation scores and which each model was trained on: a reward with a non-zero weight in a
model's run config is trained for it, a weight of 0 or ``--held_out`` marks one held-out, a LoRA folder is trained as
the base config says, and one name for two different rewards is refused (the same reward spelt with or without its
defaults is one metric)."""

from pathlib import Path

from flowrl.evaluation.metrics import gather_metrics
from flowrl.evaluation.sources import Source

BRIGHTNESS = {"class_path": "flowrl.rewards.FunctionReward",
              "init_args": {"function": "tests.rewards.reward_functions.brightness"}}


def config(*callbacks: dict) -> dict:
    return {"trainer": {"callbacks": [*callbacks, {"class_path": "flowrl.callbacks.SampleGrid"}]}}


def with_args(spec: dict, **init_args) -> dict:
    return {"class_path": spec["class_path"], "init_args": {**spec["init_args"], **init_args}}


def test_trained_and_held_out_per_model():
    digits = {"class_path": "flowrl.rewards.DigitAlignment", "init_args": {"weight": 0.0}}  # logged, not trained
    base = config(BRIGHTNESS, digits)
    run = config(with_args(BRIGHTNESS, weight=1.0, batch_size=64, name=None))  # the defaults spelt out: one metric
    sources = [Source("tuned", Path("t.ckpt"), "checkpoint", run, Path("run/config.yaml")),
               Source("folder", Path("lora/"), "lora")]
    metrics, problems = gather_metrics(base, "base.yaml", sources, ["flowrl.rewards.JpegCompressibility"])
    assert not problems
    assert metrics.names == ["brightness", "digit_alignment", "jpeg_compressibility"]  # SampleGrid is no metric
    assert metrics.trained == {"tuned": ["brightness"], "folder": ["brightness"]}
    assert [metrics.kind(m, "tuned") for m in metrics.names] == ["trained", "held-out", "held-out"]
    assert metrics.kind("brightness", "base") == "-"


def test_one_name_for_two_rewards_is_refused():
    other = with_args(BRIGHTNESS, options={"gamma": 2.0})
    sources = [Source("tuned", Path("t.ckpt"), "checkpoint", config(other), Path("run/config.yaml"))]
    _, problems = gather_metrics(config(BRIGHTNESS), "base.yaml", sources, [])
    assert problems == ["run/config.yaml: reward 'brightness' differs from the one of that name in base.yaml; give "
                        "one of them another init_args.name"]


def test_held_out_files_and_bad_entries(tmp_path):
    (tmp_path / "held.yaml").write_text("trainer:\n  callbacks:\n    - class_path: flowrl.rewards.DigitAlignment\n")
    (tmp_path / "empty.yaml").write_text("callbacks: []\n")
    metrics, problems = gather_metrics(config(BRIGHTNESS), "base.yaml", [], [
        str(tmp_path / "held.yaml"), str(tmp_path / "empty.yaml"), "flowrl.rewards.NoSuchReward",
        str(tmp_path / "missing.yaml")])
    assert metrics.names == ["brightness", "digit_alignment"]
    assert "empty.yaml lists no reward callback" in problems[0]
    assert "--held_out flowrl.rewards.NoSuchReward" in problems[1]
    assert "missing.yaml does not exist" in problems[2] and len(problems) == 3
