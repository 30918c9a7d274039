"""Flow-GRPO (arXiv 2505.05470): GRPO on the flow SDE, one outcome reward per trajectory.

The shared loop is the whole algorithm: SDE sampling on every step, group advantages (``grpo@flow_grpo``:
population std of the gathered batch, +1e-4, clip 5) broadcast to every trained step, PPO clip 1e-4, optional KL.
"""

from flowrl.methods.grpo_loop import GRPOLoop


class FlowGRPO(GRPOLoop):
    """Flow-GRPO. Every option is the shared loop's (see :class:`~flowrl.methods.grpo_loop.GRPOLoop`)."""
