"""Every method on every family (``method_matrix.py``): the pre-load checks of every (method, family) pair pass, or
refuse with the reason; one real rollout and update (a one-batch ``python -m flowrl fit``) of a covering set of pairs
runs in the default suite (every method on at least two new families, every new family with at least three
methods), and of every pair under ``-m slow``."""

from collections import Counter

import numpy as np
import pytest
import yaml

from flowrl.cli import main
from tests.cli.no_weights import Built, stop_when_built
from tests.policies.method_matrix import FAMILIES, METHODS, NEW_FAMILIES, REFUSED, config
from tests.policies.test_sd3 import metrics

PAIRS = [(m, f) for m in METHODS for f in FAMILIES]
#: the default run's covering: (method, family)
COVERING = [("flow_grpo", "zimage"), ("flow_grpo", "wan"),
            ("dense_grpo", "flux2"), ("dense_grpo", "qwen_edit"), ("dense_grpo", "wan"),
            ("tp_grpo", "qwen_image"), ("tp_grpo", "kontext"),
            ("tempflow_grpo", "flux2"), ("tempflow_grpo", "kontext"),
            ("tree_rpo", "zimage"), ("tree_rpo", "qwen_edit"), ("tree_rpo", "wan"),
            ("branch_grpo", "qwen_image"), ("branch_grpo", "kontext"),
            ("g2rpo", "flux2"), ("g2rpo", "zimage"),
            ("diffusion_nft", "qwen_image"), ("diffusion_nft", "qwen_edit"),
            ("tdm_r1", "flux2_distilled"), ("tdm_r1", "zimage"),
            # Qwen-Image 2.1: a tree, the negative-aware fine-tuning and the distillation family (Flow-GRPO:
            # test_family_fits.py)
            ("tree_rpo", "qwen_image21"), ("diffusion_nft", "qwen_image21"), ("tdm_r1", "qwen_image21"),
            ("mix_grpo", "qwen_image"), ("mix_grpo", "flux2"), ("gcpo", "zimage"), ("gcpo", "kontext"),
            ("flash_grpo", "wan"), ("flash_grpo", "qwen_edit"),
            # HunyuanVideo 1.5 image-to-video (text-to-video: TempFlow-GRPO with VideoReward in test_hunyuan_video15.py)
            ("flow_grpo", "hunyuan15_i2v"),
            # LTX-2 image-to-video: the completions decode with their trajectories' first frames
            ("dense_grpo", "ltx2_i2v")]


def model_dir(request, family: str) -> str:
    folder = request.getfixturevalue(FAMILIES[family].fixture)
    return folder[FAMILIES[family].key] if FAMILIES[family].key else folder


def run_problems(cfg: dict, tmp_path, monkeypatch) -> list[str]:
    """Every problem ``fit`` reports for ``cfg`` before any weight loads (the parsed config's and the built run's),
    every weight load refused; ``[]`` when the run is built and would start training."""
    path = tmp_path / "checked.yaml"
    path.write_text(yaml.safe_dump(cfg))
    stop_when_built(monkeypatch, {})
    try:
        main(["fit", "--config", str(path)])
    except Built:
        return []
    except SystemExit as err:
        return [line.strip() for line in str(err).splitlines()[1:]]
    raise AssertionError("fit went past its checks with every weight load refused")


def test_the_covering_covers():
    family_of = lambda f: "flux2" if f.startswith("flux2") else f  # noqa: E731
    per_method = Counter(m for m, f in COVERING if family_of(f) in NEW_FAMILIES)
    per_family = Counter(family_of(f) for m, f in COVERING)
    assert all(per_method[m] >= 2 for m in METHODS), per_method
    assert all(per_family[f] >= 3 for f in NEW_FAMILIES), per_family
    assert not set(COVERING) & set(REFUSED)


@pytest.mark.parametrize("method,family", PAIRS, ids=[f"{m}-{f}" for m, f in PAIRS])
def test_the_checks_before_loading_pass_or_say_why(method, family, request, tmp_path, monkeypatch):
    problems = run_problems(config(method, family, model_dir(request, family), tmp_path), tmp_path, monkeypatch)
    if (method, family) in REFUSED:
        assert len(problems) == 1 and REFUSED[method, family] in problems[0], problems
    else:
        assert problems == []


@pytest.mark.parametrize("method,family,change,says", [
    ("flow_grpo", "sd15", {"step_kind": "flow_grpo"}, "reads the model output as a velocity, but the policy predicts"),
    ("flow_grpo", "sd3", {"step_kind": "ddim"}, "as a epsilon, but the policy predicts velocity"),
    ("flow_grpo", "flux2_distilled", {"guidance_scale": 4.5}, "step-distilled without guidance"),
    ("tdm_r1", "flux2_distilled", {"teacher_guidance": 4.5}, "no CFG to form; set both to 1.0"),
    ("dense_grpo", "sd15", {"noise_level": 1.0}, "past 1, where the step is undefined"),
    ("branch_grpo", "sd15", {"split_noise_scale": 4.0}, "times the tree's noise scale at its branching steps"),
    ("flow_grpo", "sd15", {"noise_level": 1.5}, "exceeds 1, the largest the ddim step is defined for"),
    ("diffusion_nft", "flux", {"policy": {"init_args": {"lora": None}}}, "trains named LoRA adapters"),
])
def test_what_a_family_needs_is_checked_before_loading(method, family, change, says, request, tmp_path,
                                                      monkeypatch):
    cfg = config(method, family, model_dir(request, family), tmp_path)
    for key, value in change.items():
        if key == "policy":
            cfg["model"]["init_args"]["policy"]["init_args"].update(value["init_args"])
        else:
            cfg["model"]["init_args"][key] = value
    problems = run_problems(cfg, tmp_path, monkeypatch)
    assert len(problems) == 1 and says in problems[0], problems


def check_fits_a_batch(method, family, request, tmp_path):
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(config(method, family, model_dir(request, family), tmp_path)))
    main(["fit", "--config", str(path)])
    logged = metrics(tmp_path)
    assert np.isfinite(logged["train/reward/total"])
    if "train/check_ratio_max_dev" in logged:  # the policy-gradient methods: on-policy before the update
        assert logged["train/check_ratio_max_dev"] < 1e-4
    assert any(np.isfinite(v) for k, v in logged.items() if k.startswith(("train/loss", "train/grad_norm")))


@pytest.mark.parametrize("method,family", COVERING, ids=[f"{m}-{f}" for m, f in COVERING])
def test_a_covering_of_the_matrix_fits_a_batch(method, family, request, tmp_path):
    check_fits_a_batch(method, family, request, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("method,family", [p for p in PAIRS if p not in REFUSED],
                         ids=[f"{m}-{f}" for m, f in PAIRS if (m, f) not in REFUSED])
def test_every_method_fits_a_batch_on_every_family(method, family, request, tmp_path):
    check_fits_a_batch(method, family, request, tmp_path)
