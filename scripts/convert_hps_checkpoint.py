"""Convert a published HPSv2 / HPSv2.1 open_clip checkpoint into a transformers ``CLIPModel`` folder.

    python scripts/convert_hps_checkpoint.py --version v2.1 --output checkpoints/hps-v2.1
    python scripts/convert_hps_checkpoint.py --checkpoint HPS_v2_compressed.pt --output checkpoints/hps-v2.0

The folder holds the converted weights (``save_pretrained``) and the base model's processor, and loads with
``flowrl.rewards.HPSv2(model="checkpoints/hps-v2.1")``. The key map is :mod:`flowrl.rewards.open_clip_keys` (the
same code ``HPSv2`` runs when it is given the ``.pt`` file directly); every key must map and every weight be filled.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flowrl.rewards.hps import HPS_CHECKPOINTS
from flowrl.rewards.hub_file import check_file, fetch_file
from flowrl.rewards.open_clip_keys import clip_model_from_open_clip, load_open_clip_state_dict


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", choices=sorted(HPS_CHECKPOINTS), default="v2.1",
                        help="which published checkpoint to fetch when --checkpoint is not given")
    parser.add_argument("--checkpoint", help="a local .pt file or 'org/repo/file.pt' on the hub")
    parser.add_argument("--processor", default="laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                        help="tokenizer + image processor of the base model, saved beside the weights")
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument("--vision-heads", type=int, default=16, help="ViT-H-14: 1280 / head width 80 = 16")
    parser.add_argument("--text-heads", type=int, default=16, help="ViT-H-14 text tower: 16")
    return parser.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    checkpoint = check_file(args.checkpoint or HPS_CHECKPOINTS[args.version])  # a missing file fails first
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(args.processor)
    special = {k: getattr(processor.tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    model = clip_model_from_open_clip(load_open_clip_state_dict(fetch_file(checkpoint)),
                                      vision_heads=args.vision_heads, text_heads=args.text_heads, **special)
    output = Path(args.output)
    model.save_pretrained(output)
    processor.save_pretrained(output)
    print(f"wrote {output} from {checkpoint}; load it with flowrl.rewards.HPSv2(model={str(output)!r})")
    return output


if __name__ == "__main__":
    main()
