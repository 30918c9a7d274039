"""ImageReward-v1.0 as a reward callback: human-preference score of an image for its prompt (arXiv 2304.05977).

Score: the published standardised reward ``(r - 0.16717) / 1.03334`` (about zero mean and unit std over the
published evaluation set; higher is better; unbounded). The model and its preprocessing are described in
``flowrl.rewards.image_reward_model``; images are rounded to 8 bits first, as the published pipeline reads PIL
images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from torch import Tensor
from transformers import AutoTokenizer

from flowrl.model_paths import resolve_model
from flowrl.rewards.base import ModelReward
from flowrl.rewards.image_reward_checkpoint import (DEFAULT_TOKENIZER, PUBLISHED_FILE, PUBLISHED_REPO,
                                                    check_vocabulary, load_published)
from flowrl.rewards.image_reward_model import PROMPT_TOKENS, ImageRewardModel, preprocess, standardise
from flowrl.rewards.pil_images import to_pil
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


class ImageReward(ModelReward):
    """The ImageReward-v1.0 score of each image for its prompt.

    Args:
        model: a folder or hub id written by ``scripts/convert_image_reward_checkpoint.py`` (transformers layout:
            ``config.json``, ``model.safetensors``, tokenizer files); or the published layout, converted in memory
            at load: the ``ImageReward.pt`` file, a folder holding it (with ``med_config.json``), or the hub repo
            ``THUDM/ImageReward`` (the default).
        tokenizer: the BERT tokenizer for the published layout (BLIP adds ``[DEC]`` and ``[ENC]`` to it).
        weight, name, batch_size, device, dtype, frames, frame_reduction: as :class:`~flowrl.rewards.ModelReward`.
    """

    default_name = "image_reward"

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 32,
                 model: str = PUBLISHED_REPO, tokenizer: str = DEFAULT_TOKENIZER, device: Optional[str] = None,
                 dtype: str = "float32", frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        super().__init__(resolve_model(model), weight, name, batch_size, device, dtype,  # a missing path fails now
                         frames, frame_reduction)
        self.tokenizer_id, self.tokenizer = tokenizer, None

    def _load(self, model, device, dtype):
        path = Path(model)
        if not path.exists():
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", PUBLISHED_FILE]))
        if (path / "config.json").is_file():
            net, self.tokenizer = ImageRewardModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
            check_vocabulary(net, self.tokenizer)
        else:
            checkpoint = path if path.is_file() else path / PUBLISHED_FILE
            if not checkpoint.is_file():
                raise FileNotFoundError(f"ImageReward model {model!r}: no config.json (converted layout) and no "
                                        f"{PUBLISHED_FILE} (published layout) in {path}; convert the published "
                                        f"checkpoint with scripts/convert_image_reward_checkpoint.py")
            net, self.tokenizer = load_published(checkpoint, self.tokenizer_id)
        net = net.eval().requires_grad_(False).to(device, dtype)
        net.mlp.float()  # the published head runs on .float() features; it is 1.3M weights
        return net

    def _score(self, images, prompts, metadata) -> Tensor:
        device = self.model_device
        size = self.model.config.vision_config.image_size
        pixels = preprocess(to_pil(images), size).to(device, self.dtype)
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=PROMPT_TOKENS,
                                return_tensors="pt").to(device)
        return standardise(self.model(pixels, tokens["input_ids"], tokens["attention_mask"]))
