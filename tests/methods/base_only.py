"""A method that is not policy gradient, on the base layer alone: reward-weighted flow matching on the policy's own ODE
samples (the samples above the batch's mean reward, by ``threshold`` standard deviations, are regressed on with the
flow-matching loss). It overrides only ``update``: sampling, scoring, the gather, advantages and logging are the
loop's. Not a published method: the shape of a likelihood-free one, for the tests."""

import torch

from flowrl.methods import BaseModule
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.sampler import seeded_noise


class ScoreOnly(BaseModule):
    """Options beyond the base's:

    Args:
        threshold: keep the samples whose reward exceeds the batch mean by this many standard deviations.
    """

    def __init__(self, policy: FlowPolicy, threshold: float = 0.0, **kwargs):
        super().__init__(policy, **kwargs)
        self.threshold = threshold

    def update(self, rollout, cond, batch):
        total, valid = batch.mine(batch.total), batch.mine(batch.valid)
        keep = valid & (total >= total[valid].mean() + self.threshold * total[valid].std())
        self.policy.train()
        x0, noise = rollout.final(), seeded_noise(rollout.seeds + 1, self.policy.latent_shape(), 1)[:, 0]
        t = torch.full((len(x0),), 0.5)
        v = self.generation.velocity((1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise, t,
                          cond.select(rollout.cond_rows), 1.0)
        loss = ((v - (noise - x0)).square().mean(dim=(1, 2, 3)) * keep).sum() / keep.sum().clamp(min=1)
        steps = self.training_steps()
        steps.backward(loss)
        norm = steps.optimizer_step(self.optimizers(), bool(torch.isfinite(loss)))
        return {"loss": float(loss.detach()), "grad_norm": norm if norm is not None else float("nan"),
                "kept": float(keep.float().mean())}
