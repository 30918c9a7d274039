"""Reward models as Lightning callbacks (installed as ``flowrl.rewards``)."""

from flowrl.rewards.base import ModelReward, RewardCallback, reward_callbacks
from flowrl.rewards.digit_alignment import DigitAlignment
from flowrl.rewards.function import FunctionReward
from flowrl.rewards.image_reward import ImageReward
from flowrl.rewards.jpeg import JpegCompressibility, JpegIncompressibility, jpeg_size_kb
from flowrl.rewards.ocr import OcrReward
from flowrl.rewards.vlm_judge import VlmJudge

__all__ = ["DigitAlignment", "FunctionReward", "ImageReward", "JpegCompressibility", "JpegIncompressibility", "ModelReward", "OcrReward", "RewardCallback", "VlmJudge", "jpeg_size_kb",
           "reward_callbacks"]
