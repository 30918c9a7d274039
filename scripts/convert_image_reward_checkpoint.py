"""Convert the published ImageReward-v1.0 checkpoint to a transformers folder that ``flowrl.rewards.ImageReward``
loads with ``from_pretrained`` (``config.json`` + ``model.safetensors`` + BLIP's BERT tokenizer).

    python scripts/convert_image_reward_checkpoint.py --out checkpoints/image-reward
    python scripts/convert_image_reward_checkpoint.py --checkpoint ~/ImageReward.pt --out checkpoints/image-reward

Without ``--checkpoint`` the script fetches ``ImageReward.pt`` and ``med_config.json`` from the hub repo
``THUDM/ImageReward``; the tokenizer is ``bert-base-uncased`` plus BLIP's ``[DEC]``/``[ENC]`` tokens. The key map
is ``flowrl.rewards.image_reward_checkpoint``; every tensor is checked by a strict load, and the script prints the
parameter count (published: 446.2 M = ViT-L/16 303.3 M + BERT-base with cross-attention 142.0 M + head 0.9 M).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from flowrl.rewards.image_reward_checkpoint import (DEFAULT_TOKENIZER, PUBLISHED_FILE, PUBLISHED_REPO,
                                                    load_published)


def fetch_published(repo: str) -> Path:
    """The published checkpoint from the hub (``med_config.json`` beside it)."""
    from huggingface_hub import hf_hub_download

    hf_hub_download(repo, "med_config.json")
    return Path(hf_hub_download(repo, PUBLISHED_FILE))


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help=f"the published {PUBLISHED_FILE} (default: fetched from {PUBLISHED_REPO})")
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="BERT tokenizer id or folder")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)
    checkpoint = Path(args.checkpoint).expanduser() if args.checkpoint else fetch_published(PUBLISHED_REPO)
    if not checkpoint.is_file():
        parser.error(f"--checkpoint {checkpoint} does not exist; pass the published {PUBLISHED_FILE}")
    model, tokenizer = load_published(checkpoint, args.tokenizer)
    out = Path(args.out)
    model.to(getattr(torch, args.dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{len(tokenizer)} tokens")
    return out


if __name__ == "__main__":
    main()
