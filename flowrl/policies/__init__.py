"""Adapters around diffusers models (only this package imports diffusers)."""

from flowrl.policies.base import Conditioning, FlowPolicy, LoraOptions
from flowrl.policies.tiny import TinyFlowPolicy

__all__ = ["Conditioning", "FlowPolicy", "LoraOptions", "TinyFlowPolicy"]
