"""Prompt records with source images for edit fits, and a probe reward that records the sources each scored image
saw (a FunctionReward target: ``tests.policies.edit_records.source_probe``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from flowrl.policies.source_latents import row_key

EDITS = ["make the cat blue", "remove the tree", "add a red hat"]
#: (prompt, image keys) of every image the probe scored, one list per call
SEEN: list[list[tuple[str, str]]] = []


def write_records(folder: Path, sizes=((40, 48), (30, 90), (40, 48)), seed: int = 0, per_record: int = 1) -> Path:
    """``folder/records.jsonl``: one record per size, each with ``per_record`` random-texture PNG sources (``(H, W)``)
    written under ``folder/sources``; returns the file's path."""
    rng = np.random.default_rng(seed)
    lines = []
    for i, (h, w) in enumerate(sizes):
        names = []
        for j in range(per_record):
            name = f"sources/{i}_{j}.png"
            (folder / "sources").mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / name)
            names.append(name)
        lines.append(json.dumps({"prompt": EDITS[i % len(EDITS)], "images": names}))
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "records.jsonl"


def source_probe(images, prompts, metadata):
    """Records each scored image's prompt and sources; scores how close the output's mean brightness is to its first
    source's (a function of output and source)."""
    rows = metadata["images"]
    SEEN.append([(prompt, row_key(row)) for prompt, row in zip(prompts, rows)])
    brightness = torch.stack([row[0].float().mean() for row in rows]).to(images.device)
    return 1 - (images.float().mean(dim=(1, 2, 3)) - brightness).abs()
