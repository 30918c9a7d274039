"""Reward models as Lightning callbacks (installed as ``flowrl.rewards``).

Each reward loads its own dependencies only when it is used: ``import flowrl.rewards`` and importing one reward
(``from flowrl.rewards import JpegCompressibility``) do not import transformers, diffusers or the policies.
"""

from importlib import import_module

from flowrl.rewards.base import ModelReward, RewardCallback, reward_callbacks  # noqa: F401  (re-exported)
from flowrl.rewards.reward_set import RewardSet  # noqa: F401  (re-exported)

#: public name -> the module that defines it (imported on first use, PEP 562)
_LAZY = {
    "Aesthetic": "aesthetic", "AestheticHead": "aesthetic", "CLIPScore": "clip_score",
    "DigitAlignment": "digit_alignment", "EditConsistency": "edit_consistency", "FunctionReward": "function",
    "HPSv2": "hps", "ImageReward": "image_reward", "ImageSimilarity": "image_similarity",
    "JpegCompressibility": "jpeg", "JpegIncompressibility": "jpeg", "jpeg_size_kb": "jpeg", "OcrReward": "ocr",
    "PickScore": "pickscore", "RemoteReward": "remote", "TemporalConsistency": "temporal_consistency",
    "VideoReward": "video_reward", "VideoScore2": "videoscore2", "VlmJudge": "vlm_judge",
}

__all__ = sorted([*_LAZY, "ModelReward", "RewardCallback", "RewardSet", "reward_callbacks"])


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"flowrl.rewards.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'flowrl.rewards' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
