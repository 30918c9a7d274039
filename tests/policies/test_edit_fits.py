"""Two-step ``python -m flowrl fit`` runs of the editing families on tiny pipelines from prompt records with source
images: with LoRA and recomputed log-probs the first minibatch is exactly on-policy, the edit reward (a function of
output and source) is logged, and the exported LoRA loads into the plain pipeline; the rewards change with the
sources; DenseGRPO's ODE completions are scored with their own trajectories' sources; records whose sources are
missing or miscounted stop the CLI before any weight loads."""

import json
from collections import Counter

import numpy as np
import pytest
import torch
from diffusers import FluxKontextPipeline, QwenImageEditPlusPipeline
from peft.utils import get_peft_model_state_dict

from flowrl.cli import main
from flowrl.policies.source_latents import row_key
from flowrl.prompt_records import load_image, load_records
from tests.policies import edit_records
from tests.policies.edit_records import write_records
from tests.policies.test_sd3 import HERE, metrics
from tests.policies.tiny_editing import CONDITION_AREA, SOURCE_AREA

POLICY = "--model.init_args.policy"
#: family: (policy class, plain pipeline, its tiny sizes)
FAMILIES = {
    "qwen_edit": ("flowrl.policies.QwenImageEditPolicy", QwenImageEditPlusPipeline,
                  [f"{POLICY}.init_args.source_area={SOURCE_AREA}",
                   f"{POLICY}.init_args.condition_area={CONDITION_AREA}"]),
    "kontext": ("flowrl.policies.FluxKontextPolicy", FluxKontextPipeline,
                [f"{POLICY}.init_args.source_area={32 * 48}", f"{POLICY}.init_args.max_sequence_length=16"]),
}
CHECKPOINT = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint"]


def edit_args(family, model_dir, out, records, *extra, method="flowrl.methods.FlowGRPO"):
    """``fit_edit.yaml`` with ``method`` (switched first, so that the policy's options below override it), the family's
    policy, model and tiny sizes, and the prompt records."""
    policy, _, sizes = FAMILIES[family]
    return ["fit", "--config", str(HERE / "fit_edit.yaml"), f"--model.class_path={method}",
            f"{POLICY}.class_path={policy}", f"{POLICY}.init_args.model={model_dir}", *sizes,
            f"--data.prompts={records}", f"--trainer.default_root_dir={out}",
            f"--trainer.logger.init_args.save_dir={out}", *extra]


@pytest.fixture
def model_dir(request, qwen_edit_plus_dir, flux_kontext_dir):
    return {"qwen_edit": qwen_edit_plus_dir, "kontext": flux_kontext_dir}[request.param]


@pytest.mark.parametrize("family,model_dir", [(f, f) for f in FAMILIES], indirect=["model_dir"])
def test_edit_fit_is_on_policy_and_its_export_loads_into_the_pipeline(family, model_dir, tmp_path):
    records = write_records(tmp_path / "data", per_record=2 if family == "qwen_edit" else 1)
    main(edit_args(family, model_dir, tmp_path / "run", records, "--trainer.max_steps=2",
                   "--model.init_args.recompute_log_probs=true", "--model.init_args.micro_batch_size=1", *CHECKPOINT))
    logged = metrics(tmp_path / "run")
    assert logged["train/check_ratio_max_dev"] == 0.0 and logged["train/ratio_max_dev"] == 0.0
    assert 0 < logged["train/reward/edit_consistency"] <= 1 and np.isfinite(logged["train/loss"])
    assert logged["step"] == 1  # the second optimizer step logged
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "lora")])
    trained = {k[len("policy.denoiser."):].replace(".default", ""): v
               for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items() if "lora_" in k}
    pipe = FAMILIES[family][1].from_pretrained(model_dir)
    pipe.load_lora_weights(tmp_path / "lora")
    loaded = get_peft_model_state_dict(pipe.transformer, adapter_name="default_0")
    assert trained and sorted(loaded) == sorted(trained)
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert any(v.abs().sum() > 0 for k, v in trained.items() if "lora_B" in k)  # B starts at 0: it trained


def test_full_finetuning_edit_fit_is_on_policy_and_exports_the_pipeline(flux_kontext_dir, tmp_path):
    records = write_records(tmp_path / "data")
    main(edit_args("kontext", flux_kontext_dir, tmp_path / "run", records, f"{POLICY}.init_args.lora=null",
                   "--trainer.max_steps=2", *CHECKPOINT))
    assert metrics(tmp_path / "run")["train/check_ratio_max_dev"] < 1e-5
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "full")])
    trained = {k[len("policy.denoiser."):]: v for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items()
               if k.startswith("policy.denoiser.")}
    loaded = FluxKontextPipeline.from_pretrained(tmp_path / "full").transformer.state_dict()
    base = FluxKontextPipeline.from_pretrained(flux_kontext_dir).transformer.state_dict()
    assert len(trained) > 20 and all(torch.equal(loaded[k], v) for k, v in trained.items())
    assert any(not torch.equal(loaded[k], base[k]) for k in trained)  # trained, not the model it started from


def test_the_same_edits_of_other_sources_are_rewarded_otherwise(flux_kontext_dir, tmp_path):
    rewards = []
    for seed in (0, 1):  # the same prompts, seeds and model; only the source images' pixels differ
        records = write_records(tmp_path / f"data{seed}", seed=seed)
        main(edit_args("kontext", flux_kontext_dir, tmp_path / f"run{seed}", records))
        logged = metrics(tmp_path / f"run{seed}")
        assert logged["train/check_ratio_max_dev"] < 1e-5  # on-policy without recomputing: float32 rounding only
        rewards.append(logged["train/reward/edit_consistency"])
    assert abs(rewards[0] - rewards[1]) > 1e-3


def test_dense_grpo_completions_of_an_edit_see_their_own_sources(flux_kontext_dir, tmp_path):
    records = write_records(tmp_path / "data", sizes=((40, 48), (30, 90)))
    own = {r.prompt: row_key([load_image(p) for p in r.images]) for r in load_records(str(records))}
    edit_records.SEEN.clear()
    main(edit_args("kontext", flux_kontext_dir, tmp_path / "run", records, "--model.init_args.calibration=null",
                   "--trainer.callbacks=[]", "--trainer.callbacks+=flowrl.rewards.FunctionReward",
                   "--trainer.callbacks.function=tests.policies.edit_records.source_probe",
                   method="flowrl.methods.DenseGRPO"))
    scored = [pair for call in edit_records.SEEN for pair in call]
    assert all(key == own[prompt] for prompt, key in scored)  # every image saw its own record's sources
    # 4 trajectories x 3 steps: 12 ODE completions, then the 4 final images, each scored once
    assert len(scored) == 4 * 3 + 4 and Counter(p for p, _ in scored) == {p: 8 for p in own}
    assert np.isfinite(metrics(tmp_path / "run")["train/reward/source_probe"])


def test_the_editing_pages_worked_example_runs_and_gives_its_numbers(flux_kontext_dir, tmp_path, monkeypatch):
    import csv
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root / "docs/data/editing"))  # the page's PYTHONPATH: its edit_rewards.py
    main(["fit", "--config", str(root / "configs/flux_kontext_flow_grpo.yaml"),
          "--config", str(root / "docs/data/editing/tiny_cpu.yaml"), f"{POLICY}.init_args.model={flux_kontext_dir}",
          f"--data.prompts={root / 'docs/data/editing/records.jsonl'}", f"--trainer.default_root_dir={tmp_path}",
          f"--trainer.logger.init_args.save_dir={tmp_path}"])
    first = next(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    page = (root / "docs/editing.md").read_text()
    for reward in ("edit_consistency", "keeps_palette"):  # the page quotes the first batch's rewards
        assert f"`train/reward/{reward}` ({float(first[f'train/reward/{reward}']):.3f}" in page
    assert float(first["train/check_ratio_max_dev"]) < 1e-5 and list(tmp_path.rglob("samples/step_000001.png"))


@pytest.mark.parametrize("family,model_dir", [(f, f) for f in FAMILIES], indirect=["model_dir"])
def test_records_with_missing_or_miscounted_sources_fail_before_any_weight_loads(family, model_dir, tmp_path,
                                                                                 refuse_weights):
    records = write_records(tmp_path / "data", sizes=((40, 48), (40, 48), (40, 48)))
    (tmp_path / "data/sources/1_0.png").unlink()  # line 2's source is gone
    lines = records.read_text().splitlines()
    # line 3: two sources for Kontext (it takes exactly one), none for Qwen-Image-Edit(-Plus) (it takes at least one)
    lines[2] = json.dumps({"prompt": "add a red hat", "images": ["sources/0_0.png"] * 2 if family == "kontext"
                           else []})
    records.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as err:  # refuse_weights: any diffusers from_pretrained fails the test instead
        main(edit_args(family, model_dir, tmp_path / "run", records))
    message, policy = str(err.value), FAMILIES[family][0].rpartition(".")[2]
    assert f"data.prompts={records} line 2: image '{tmp_path / 'data/sources/1_0.png'}' does not exist" in message
    count = "has 2 images; FluxKontextPolicy takes exactly 1" if family == "kontext" else \
        f"has no images; {policy} takes at least 1"
    assert f"data.prompts={records} line 3 {count} per prompt" in message
    assert "line 1" not in message  # the good record is not named
