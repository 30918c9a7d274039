"""scripts/count_parameters.py: its LoRA count is what peft adds (peft's own injection as the oracle, and the
arithmetic by hand), the published transformer configs have the sizes the models are named by, and docs/models.md's
memory tables print what the script counts."""

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.count_parameters import FAMILIES, build_transformer, count, lora_numel, numel  # noqa: E402


def peft_adds(model: torch.nn.Module, rank: int, targets: list[str]) -> int:
    from peft import LoraConfig, inject_adapter_in_model

    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets), model)
    return sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)


def test_the_lora_count_is_what_peft_adds():
    import yaml

    from flowrl.policies.flux2 import flux2_lora_targets
    from tests.policies.tiny_families import flux2_klein_components, qwen_image_components

    qwen_config = yaml.safe_load((ROOT / "configs/qwen_image_flow_grpo.yaml").read_text())
    qwen_targets = qwen_config["model"]["init_args"]["policy"]["init_args"]["lora"]["target_modules"]
    for model, targets in [(qwen_image_components()["transformer"], qwen_targets),  # both streams' MLPs too
                           (flux2_klein_components()["transformer"], list(flux2_lora_targets(1)))]:  # per block
        counted = lora_numel(model, 4, targets)
        assert counted == peft_adds(model, 4, targets) > 0


def test_the_lora_count_by_hand():
    from tests.policies.tiny_wan import transformer

    # the tests' Wan: 2 blocks 24 wide (2 heads of 12); "to_q" is in each block's self- and cross-attention, each a
    # 24 -> 24 linear: 2 blocks x 2 x r (24 + 24) = 2 x 2 x 8 x 48 = 1536 at rank 8
    assert lora_numel(transformer(), 8, ["to_q"]) == 1536


def test_published_transformers_have_the_sizes_they_are_named_by():
    # billions of parameters in each model's name or announcement (Wan's "1.3B" is 1.42B: within 10%)
    named = {"qwen_image": 20, "flux2_klein_4b": 4, "flux2_klein_9b": 9, "flux2_dev": 32, "zimage": 6,
             "flux1_dev": 12, "wan21_1b3": 1.3, "wan21_14b": 14}
    with torch.device("meta"):
        sizes = {name: numel(build_transformer(name)) / 1e9 for name in named}
    assert all(abs(sizes[name] / billions - 1) < 0.1 for name, billions in named.items()), sizes


#: the first cell of each row of docs/models.md's memory tables and the FAMILIES entry it is computed from
DOC_ROWS = {"Qwen-Image": "qwen_image", "FLUX.2 [klein] 4B": "flux2_klein_4b", "FLUX.2 [klein] 9B": "flux2_klein_9b",
            "FLUX.2 [dev]": "flux2_dev", "Z-Image(-Turbo)": "zimage", "Qwen-Image-Edit(-2509 / 2511)": "qwen_image",
            "FLUX.1 Kontext [dev]": "flux_kontext", "Qwen-Image 2.1": "qwen_image21"}
NUMBER = r"(\d+(?:\.\d+)?)"


def agrees(printed: str, value: float) -> bool:
    """``printed`` is ``value`` rounded to the digits it shows."""
    decimals = len(printed.partition(".")[2])
    return abs(float(printed) - value) <= 0.5 * 10 ** -decimals + 1e-9


@pytest.mark.slow  # every published model of the page built on the meta device: a minute on a loaded CPU
def test_the_models_pages_memory_tables_print_the_counts():
    rows = [line.split("|")[1:-1] for line in (ROOT / "docs/models.md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in DOC_ROWS and " GB" in line]
    assert sorted(cells[0].strip() for cells in rows) == sorted(DOC_ROWS)
    counts = {family: count(family) for family in set(DOC_ROWS.values())}
    for cells in rows:
        got = counts[DOC_ROWS[cells[0].strip()]]
        transformer, text, vae, frozen, lora, full = (cell.strip() for cell in cells[1:7])
        encoders = re.findall(NUMBER + r" B\b", text)
        lora_m, lora_gb = re.fullmatch(r"(?:default targets )?" + NUMBER + " M: " + NUMBER + " GB", lora).groups()
        checks = [(transformer[:-2], got["transformer_b"]), (vae[:-2], got["vae_b"]),
                  (re.match("~" + NUMBER, frozen)[1], got["frozen_bf16_gb"]), (lora_m, got["lora_m"]),
                  (lora_gb, got["lora_gb"]), (re.match("~" + NUMBER, full)[1], got["full_finetune_gb"]),
                  *zip(encoders, got["text_encoders_b"].values())]
        assert len(encoders) == len(got["text_encoders_b"]), cells
        assert all(agrees(printed, value) for printed, value in checks), (cells, got)
