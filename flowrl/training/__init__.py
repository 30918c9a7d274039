"""Components the methods call, each usable and testable without a LightningModule: the PPO update
(:mod:`~flowrl.training.ppo_update`) and its minibatches (:mod:`~flowrl.training.micro_batches`), the optimizer steps
of named adapters (:mod:`~flowrl.training.adapter_steps`), the skipping of non-finite steps
(:mod:`~flowrl.training.nonfinite`), and :class:`~flowrl.training.steps.TrainingSteps`, the callables through which
they reach the training loop (backward, gradient sync, the checked optimizer step, collectives).
"""

from flowrl.training.nonfinite import NonfiniteSteps
from flowrl.training.ppo_update import PPOUpdate, UpdateBatch
from flowrl.training.steps import TrainingSteps, plain_steps

__all__ = ["NonfiniteSteps", "PPOUpdate", "TrainingSteps", "UpdateBatch", "plain_steps"]
