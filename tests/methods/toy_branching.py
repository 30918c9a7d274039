"""A toy tree method written on the method layer in a few lines: per prompt one tree, an ODE prefix, one shared SDE
step, then two SDE branches completed with the ODE. Rows (leaves) outnumber prompts, each row carries its prompt's
conditioning row and its tree node ids, the shared SDE step is trained once per tree, and the ``tree`` estimator
reads the node ids through the advantage hook. Not a published method: the shape of one, for the tests."""

from typing import Any

import torch

from flowrl.policies.base import FlowPolicy
from flowrl.methods import PolicyGradient
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import path_noise, sample_from, seeded_noise


class TwoBranches(PolicyGradient):
    min_group_size = 1  # one tree per prompt: its leaves are the group

    def __init__(self, policy: FlowPolicy, branch_step: int = 2, advantage: str = "tree",
                 advantage_options: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(policy, advantage=advantage, advantage_options=advantage_options or {
            "among": "siblings", "eps": 1e-4, "ddof": 0}, **kwargs)
        self.branch_step = branch_step  # the step at which every tree splits in two; the step before it is shared

    def rollout(self, batch: dict, cond) -> Rollout:
        T, b, shape = self.num_steps, self.branch_step, self.policy.latent_shape()
        sigmas = self.policy.sigmas(T).to(self.device)
        seeds, n = batch["seeds"], len(batch["seeds"])
        cond_rows = batch.get("cond_rows", torch.arange(n))
        noise = seeded_noise(seeds, shape, b + 1, self.device)
        shared_sde = torch.arange(b) == b - 1  # ODE prefix, then one stochastic step both leaves share
        velocity = self.generation.velocity_fn(cond, cond_rows)
        trunk, trunk_lp = sample_from(velocity, noise[:, 0], sigmas, 0, noise[:, 1:],
                                      self.step_kind, shared_sde, self.noise_levels())
        rows = torch.arange(n).repeat_interleave(2)  # [2n] two leaves per tree
        paths = [[child] for _ in range(n) for child in (0, 1)]
        branch_noise = path_noise(seeds[rows], paths, shape, T - b, self.device)
        branch_sde = torch.arange(T - b) == 0  # the branch step, then the ODE to the end
        leaves, leaves_lp = sample_from(self.generation.velocity_fn(cond, cond_rows[rows]), trunk[rows, -1], sigmas, b,
                                        branch_noise, self.step_kind, branch_sde, self.noise_levels())
        train = torch.zeros(T, dtype=torch.bool)
        train[b - 1] = train[b] = True
        node_ids = torch.zeros(2 * n, T, dtype=torch.long)  # the trunk is node 0 of each tree ...
        node_ids[:, b:] = 1 + torch.arange(2).repeat(n)[:, None]  # ... the leaves nodes 1 and 2
        return Rollout(prompts=[batch["prompts"][i] for i in rows], group_ids=batch["group_ids"][rows],
                       seeds=seeds[rows], latents=torch.cat([trunk[rows, :-1], leaves], 1),
                       log_probs=torch.cat([trunk_lp[rows], leaves_lp], 1), sigmas=sigmas.expand(2 * n, -1),
                       train_mask=train.expand(2 * n, -1).clone(), cond_rows=cond_rows[rows], node_ids=node_ids,
                       nfe=torch.full((2 * n,), b / 2 + (T - b)))  # the trunk's evaluations serve both leaves
