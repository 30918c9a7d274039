"""VideoReward (VideoAlign; Liu et al. 2025, arXiv 2501.13918): a Qwen2-VL-2B with a linear reward head that scores a
generated video's visual quality (VQ), motion quality (MQ) and text alignment (TA).

As the authors' ``inference.py`` (github.com/KwaiVGI/VideoAlign, with ``vision_process.py``, ``prompt_template.py``,
``trainer.py::Qwen2VLRewardModelBT`` and ``train_reward.py::create_model_and_processor``) does it:

- **frames**: ``fps`` frames per second of the clip (published config: 2.0; or ``num_frames``), uniformly sampled,
  resized to at most ``max_frame_pixels`` (200,704 = 256 x 28 x 28) and at least 128 x 28 x 28 pixels
  (:mod:`flowrl.rewards.qwen_video`);
- **prompt**: the ``detailed_special`` rubric (:mod:`flowrl.rewards.videoalign_prompt`) with the video's prompt, in
  the base model's chat template after the video, with the generation prompt;
- **scores**: the reward head (``rm_head``, no bias) on the last hidden states at the three special tokens
  ``<|VQ_reward|>``, ``<|MQ_reward|>``, ``<|TA_reward|>`` (added to the tokenizer, embeddings resized) -> ``[B, 3]``;
  normalised by the checkpoint's ``inference_config`` (``(VQ - VQ_mean) / VQ_std``, ...; ``use_norm``) and
  ``Overall = VQ + MQ + TA``.

Each dimension (``VQ``, ``MQ``, ``TA`` or ``Overall``) is one reward callback, weighted in the YAML; callbacks on one
checkpoint share its weights and its forward pass (:mod:`flowrl.rewards.shared_judge`). Where flowrl differs: the
clip's frame rate is the ``clip_fps`` option (no mp4 container to read it from); the frames are 8-bit quantised as a
decoded video's; a ``checkpoint_step`` that is missing is an error (the authors fall back to the latest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.rewards import videoalign_checkpoint as ckpt
from flowrl.rewards.qwen_video import (VIDEO_MIN_PIXELS, VideoPatching, frame_size, resize_frames, sampled_frames,
                                       video_batch)
from flowrl.rewards.shared_judge import SharedJudge
from flowrl.rewards.videoalign_prompt import SPECIAL_TOKENS, TEMPLATES

DIMENSIONS = ("VQ", "MQ", "TA")


class VideoReward(SharedJudge):
    """One dimension of VideoAlign's VideoReward (see the module docstring).

    Args:
        model: the checkpoint folder (local, or the hub's ``KwaiVGI/VideoReward``) with ``model_config.json`` and
            ``checkpoint-<step>/``.
        dimension: ``VQ`` (visual quality), ``MQ`` (motion quality), ``TA`` (text alignment) or ``Overall`` (their
            sum). name: default ``videoreward_<dimension>``.
        base_model: the Qwen2-VL the checkpoint was trained from (default: ``model_config.model_name_or_path``,
            ``Qwen/Qwen2-VL-2B-Instruct``); its tokenizer, chat template and processor settings are used.
        checkpoint_step: which ``checkpoint-<step>`` (default: the latest).
        clip_fps: the frame rate of the generated clips (Wan: 16). fps, num_frames, max_pixels: override the
            checkpoint's ``data_config`` (``fps`` and ``num_frames`` exclude each other). min_pixels: the per-frame
            minimum (``qwen_vl_utils``' 128 x 28 x 28).
        use_norm: normalise by the checkpoint's ``inference_config`` (the authors' default).
        weight, batch_size (clips per forward pass), device, dtype: as :class:`~flowrl.rewards.ModelReward`.
    """

    default_name = "videoreward"
    dimensions = (*DIMENSIONS, "Overall")

    def __init__(self, model: str = "KwaiVGI/VideoReward", dimension: str = "Overall", weight: float = 1.0,
                 name: Optional[str] = None, batch_size: int = 4, base_model: Optional[str] = None,
                 checkpoint_step: Optional[int] = None, clip_fps: float = 16.0, fps: Optional[float] = None,
                 num_frames: Optional[int] = None, max_pixels: Optional[int] = None,
                 min_pixels: int = VIDEO_MIN_PIXELS, use_norm: bool = True, device: Optional[str] = None,
                 dtype: str = "bfloat16"):
        super().__init__(resolve_model(model), dimension, weight, name, batch_size, device, dtype)
        problems = []
        if Path(self.model_id).is_dir():
            problems += ckpt.config_problems(self.model_id)
        if fps is not None and num_frames is not None:
            problems.append(f"fps={fps} and num_frames={num_frames}: set one of them (the authors' inference refuses "
                            "both)")
        if clip_fps <= 0 or (fps is not None and fps <= 0) or (num_frames is not None and num_frames < 2):
            problems.append(f"clip_fps={clip_fps} and fps={fps} must be > 0, num_frames={num_frames} >= 2")
        if problems:
            raise ValueError(f"VideoReward {self.name!r}: " + "; ".join(problems))
        self.base_model, self.checkpoint_step, self.clip_fps = base_model, checkpoint_step, clip_fps
        self.overrides = {"fps": fps, "num_frames": num_frames, "max_frame_pixels": max_pixels}
        self.min_pixels, self.use_norm = min_pixels, use_norm
        self.options = (base_model, checkpoint_step, clip_fps, fps, num_frames, max_pixels, min_pixels, use_norm)

    @classmethod
    def config_problems(cls, init_args: dict[str, Any]) -> list[str]:
        """A local checkpoint folder that is not one (see :func:`~flowrl.rewards.videoalign_checkpoint.config_problems`),
        reported by the CLI with the config's other problems."""
        model = init_args.get("model")
        if isinstance(model, str) and Path(model).expanduser().is_dir():
            return [f"VideoReward model={model!r}: {p}" for p in ckpt.config_problems(str(Path(model).expanduser()))]
        return []

    def _load(self, model: str, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

        folder = model if Path(model).is_dir() else _download(model)
        config = ckpt.read_config(folder)
        model_config, data = config["model_config"], dict(config["data_config"])
        if model_config["reward_token"] != "special" and not model_config.get("use_special_tokens"):
            raise ValueError(f"VideoReward {folder!r}: reward_token={model_config['reward_token']!r}; flowrl reads "
                             "the published form, the special reward tokens")
        if data["prompt_template_type"] not in TEMPLATES:
            raise ValueError(f"VideoReward {folder!r}: prompt_template_type={data['prompt_template_type']!r}; "
                             f"flowrl has {sorted(TEMPLATES)}")
        data.update({k: v for k, v in self.overrides.items() if v is not None})
        if self.overrides["num_frames"] is not None:
            data["fps"] = None
        base = resolve_model(self.base_model or model_config["model_name_or_path"])
        tokenizer = AutoTokenizer.from_pretrained(base)
        tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
        net = Qwen2VLForConditionalGeneration.from_pretrained(base, dtype=torch.float32)
        net.resize_token_embeddings(len(tokenizer))
        net.rm_head = torch.nn.Linear(net.config.text_config.hidden_size, model_config["output_dim"], bias=False)
        base_state = ckpt.to_transformers4(net.state_dict())
        step = ckpt.checkpoint_dir(folder, self.checkpoint_step)
        state = ckpt.merged_state_dict(step, config.get("peft_lora_config", {}), base_state)
        net.load_state_dict(ckpt.to_transformers5(state), strict=True)
        return {"net": net.eval().requires_grad_(False).to(device, dtype), "tokenizer": tokenizer, "data": data,
                "norm": config.get("inference_config"), "output_dim": model_config["output_dim"],
                "patching": VideoPatching.from_pretrained(base),
                "special_ids": tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)),
                "template": TEMPLATES[data["prompt_template_type"]]}

    def clip_pixels(self, clip: Tensor) -> Tensor:
        """``clip [F, 3, H, W]`` in ``[0, 1]`` -> the sampled, resized frames ``[n, 3, h, w]`` in ``[0, 255]``."""
        self.model_device  # loads the judge (and the checkpoint's data config) on first use
        data = self.model["data"]
        picked = sampled_frames(clip.shape[0], self.clip_fps, data.get("fps"), data.get("num_frames"))
        size = frame_size(*clip.shape[-2:], min_pixels=self.min_pixels, max_pixels=data["max_frame_pixels"])
        return resize_frames(clip[picked].cpu(), size)

    def _judge(self, clips: Tensor, prompts: list[str]) -> dict[str, Tensor]:
        judge = self.model
        texts = [judge["tokenizer"].apply_chat_template(
            [{"role": "user", "content": [{"type": "video"},
                                          {"type": "text", "text": judge["template"].format(text_prompt=p)}]}],
            tokenize=False, add_generation_prompt=True) for p in prompts]
        batch = video_batch([self.clip_pixels(c) for c in clips], texts, judge["tokenizer"], judge["patching"], "right")
        batch = {k: v.to(self.model_device) for k, v in batch.items()}
        batch["pixel_values_videos"] = batch["pixel_values_videos"].to(self.dtype)
        hidden = judge["net"].model(**batch).last_hidden_state  # [B, L, D]
        logits = judge["net"].rm_head(hidden).float()  # [B, L, N]
        special = torch.isin(batch["input_ids"], torch.tensor(judge["special_ids"], device=self.model_device))
        pooled = logits[special].view(len(prompts), len(DIMENSIONS), -1)  # [B, 3, N]
        if judge["output_dim"] == len(DIMENSIONS):
            pooled = pooled.diagonal(dim1=1, dim2=2)
        scores = dict(zip(DIMENSIONS, pooled.reshape(len(prompts), -1).unbind(-1)))
        if self.use_norm and judge["norm"]:
            scores = {d: (s - judge["norm"][f"{d}_mean"]) / judge["norm"][f"{d}_std"] for d, s in scores.items()}
        return {**scores, "Overall": sum(scores.values())}


def _download(repo_id: str) -> str:
    """A hub checkpoint's local folder (``model_config.json`` and every ``checkpoint-*``), downloaded once."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id)
