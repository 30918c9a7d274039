"""Adapters around diffusers models (only this package imports diffusers)."""

from flowrl.policies.base import Conditioning, FlowPolicy, LoraOptions
from flowrl.policies.flux import FluxPolicy
from flowrl.policies.flux2 import Flux2Policy
from flowrl.policies.flux_kontext import FluxKontextPolicy
from flowrl.policies.hunyuan_video15 import HunyuanVideo15Policy
from flowrl.policies.hunyuan_video15_i2v import HunyuanVideo15I2VPolicy
from flowrl.policies.ltx2 import LTX2Policy
from flowrl.policies.ltx2_i2v import LTX2I2VPolicy
from flowrl.policies.qwen_image import QwenImagePolicy
from flowrl.policies.qwen_image_edit import QwenImageEditPolicy
from flowrl.policies.qwen_image21 import QwenImage21Policy
from flowrl.policies.sd3 import SD3Policy
from flowrl.policies.sd15 import SD15Policy
from flowrl.policies.tiny import TinyFlowPolicy
from flowrl.policies.wan import WanPolicy
from flowrl.policies.wan_i2v import WanI2VPolicy
from flowrl.policies.z_image import ZImagePolicy

__all__ = ["Conditioning", "FlowPolicy", "Flux2Policy", "FluxKontextPolicy", "FluxPolicy", "HunyuanVideo15I2VPolicy",
           "HunyuanVideo15Policy", "LoraOptions", "LTX2I2VPolicy", "LTX2Policy",
           "QwenImage21Policy", "QwenImageEditPolicy", "QwenImagePolicy", "SD15Policy", "SD3Policy", "TinyFlowPolicy",
           "WanI2VPolicy", "WanPolicy", "ZImagePolicy"]
