"""Reward models as Lightning callbacks (installed as ``flowrl.rewards``)."""

from flowrl.rewards.aesthetic import Aesthetic, AestheticHead
from flowrl.rewards.base import ModelReward, RewardCallback, reward_callbacks
from flowrl.rewards.clip_score import CLIPScore
from flowrl.rewards.digit_alignment import DigitAlignment
from flowrl.rewards.function import FunctionReward
from flowrl.rewards.hps import HPSv2
from flowrl.rewards.image_reward import ImageReward
from flowrl.rewards.jpeg import JpegCompressibility, JpegIncompressibility, jpeg_size_kb
from flowrl.rewards.ocr import OcrReward
from flowrl.rewards.pickscore import PickScore
from flowrl.rewards.remote import RemoteReward
from flowrl.rewards.vlm_judge import VlmJudge

__all__ = ["Aesthetic", "AestheticHead", "CLIPScore", "DigitAlignment", "FunctionReward", "HPSv2", "ImageReward", "JpegCompressibility", "JpegIncompressibility", "ModelReward", "OcrReward", "PickScore", "RemoteReward", "RewardCallback", "VlmJudge", "jpeg_size_kb",
           "reward_callbacks"]
