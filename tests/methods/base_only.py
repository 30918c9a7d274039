"""A method that is not policy gradient, on the base layer alone: reward-weighted flow matching on the policy's own
ODE samples (the samples above the batch's mean reward, by ``threshold`` standard deviations, are regressed on with
the flow-matching loss). Not a published method: the shape of a likelihood-free one, for the tests."""

import torch

from flowrl.policies.base import FlowPolicy
from flowrl.methods import BaseModule
from flowrl.sampling.sampler import sample, seeded_noise
from flowrl.sampling.steps import ODE_STEPS


class ScoreOnly(BaseModule):
    """Options beyond the base's:

    Args:
        threshold: keep the samples whose reward exceeds the batch mean by this many standard deviations.
    """

    def __init__(self, policy: FlowPolicy, threshold: float = 0.0, **kwargs):
        super().__init__(policy, **kwargs)
        self.threshold = threshold

    def training_step(self, batch, batch_idx):
        self.policy.eval()
        with torch.no_grad():
            cond = self.policy.encode(batch["prompts"])
            sigmas = self.policy.sigmas(self.num_steps).to(self.device)
            latents, _ = sample(self.velocity_fn(cond), batch["seeds"], sigmas, self.policy.latent_shape(),
                                ODE_STEPS[self.policy.prediction], device=self.device)
            total, valid = self.reward_set.total(self.reward_set.score(self.policy.decode(latents[:, -1]),
                                                                       batch["prompts"]))
        keep = valid & (total >= total[valid].mean() + self.threshold * total[valid].std())
        self.policy.train()
        x0, noise = latents[:, -1], seeded_noise(batch["seeds"] + 1, self.policy.latent_shape(), 1)[:, 0]
        t = torch.full((len(x0),), 0.5)
        v = self.policy.velocity((1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise, t, cond, 1.0)
        loss = ((v - (noise - x0)).square().mean(dim=(1, 2, 3)) * keep).sum() / keep.sum().clamp(min=1)
        opt = self.optimizers()
        self.manual_backward(loss)
        self.finite_optimizer_step(opt, bool(torch.isfinite(loss)))
        self.log("train/reward/total", total[valid].mean(), prog_bar=True)
        self.log("train/loss", loss.detach())
