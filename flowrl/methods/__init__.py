"""One LightningModule per algorithm, each a few hooks on the shared loop."""

from flowrl.methods.dense_grpo import DenseGRPO
from flowrl.methods.flow_grpo import FlowGRPO
from flowrl.methods.grpo_loop import GRPOLoop
from flowrl.methods.tp_grpo import TPGRPO

__all__ = ["DenseGRPO", "FlowGRPO", "GRPOLoop", "TPGRPO"]
