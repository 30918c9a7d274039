"""flowrl: GRPO-family reinforcement learning of diffusion and flow-matching image generators on Lightning."""

__version__ = "0.1.0"
