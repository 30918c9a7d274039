"""HPSv2 / HPSv2.1 (Wu et al. 2023, arXiv 2306.09341): human preference score from a fine-tuned open_clip ViT-H-14.

Score, as the authors' ``img_score.score``: the cosine of the unit-norm image and text features (``logits_per_image``
without the logit scale), typically 0.2-0.35. Preprocessing, as their ``preprocess_val``: resize the longest side
to 224 (bicubic), pad to a square with black, CLIP mean/std (the ``"pad"`` layout of
:mod:`flowrl.rewards.clip_preprocess`).

Weights: the published open_clip checkpoints (``xswu/HPSv2``: ``HPS_v2_compressed.pt`` for v2.0,
``HPS_v2.1_compressed.pt`` for v2.1) are converted on load into a transformers ``CLIPModel`` by
:mod:`flowrl.rewards.open_clip_keys`; ``scripts/convert_hps_checkpoint.py`` writes the same conversion to a folder
once, which ``model`` then accepts like any ``from_pretrained`` folder.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.rewards.clip_reward import ClipReward
from flowrl.rewards.hub_file import check_file, fetch_file
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec

HPS_CHECKPOINTS = {"v2.0": "xswu/HPSv2/HPS_v2_compressed.pt", "v2.1": "xswu/HPSv2/HPS_v2.1_compressed.pt"}
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin")


class HPSv2(ClipReward):
    """HPSv2 score of each image against its prompt.

    Args:
        version: ``"v2.0"`` or ``"v2.1"``: picks the published checkpoint when ``model`` is not given.
        model: an open_clip checkpoint file (local, or ``org/repo/file.pt`` on the hub), or a folder (local or hub
            id) written by ``scripts/convert_hps_checkpoint.py``.
        processor: tokenizer + image processor of the base model, ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``.
        vision_heads, text_heads: attention heads of the towers (not stored in open_clip checkpoints; ViT-H-14: 16).
    """

    default_name = "hpsv2"
    layout = "pad"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64, version: str = "v2.1",
                 model: Optional[str] = None, processor: Optional[str] = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                 device: Optional[str] = None, dtype: str = "float32", vision_heads: int = 16, text_heads: int = 16,
                 frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        if version not in HPS_CHECKPOINTS:
            raise ValueError(f"HPSv2 version={version!r}; choose one of {sorted(HPS_CHECKPOINTS)}")
        self.version, self.heads = version, dict(vision_heads=vision_heads, text_heads=text_heads)
        super().__init__(model or HPS_CHECKPOINTS[version], processor, weight, name, batch_size, device, dtype,
                         frames, frame_reduction)

    def _resolve(self, model: str) -> str:
        return check_file(model) if model.endswith(CHECKPOINT_SUFFIXES) else resolve_model(model)

    def _load_clip(self, model: str, dtype):
        if not model.endswith(CHECKPOINT_SUFFIXES):
            return super()._load_clip(model, dtype)
        from flowrl.rewards.open_clip_keys import clip_model_from_open_clip, load_open_clip_state_dict

        special = {k: getattr(self.tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        return clip_model_from_open_clip(load_open_clip_state_dict(fetch_file(model)), **self.heads, **special)

    def _score(self, images, prompts, metadata) -> Tensor:
        return (self.image_embeddings(images) * self.text_embeddings(prompts)).sum(-1)
