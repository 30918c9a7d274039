"""The generating half of every method: conditioning, the guided velocity, deterministic samples from seeds, and the
validation, evaluation and prediction built on them, reduced over ranks.

:class:`Generation` is the base module's parent (:class:`~flowrl.methods.base.BaseModule` adds the training loop);
it reads ``policy``, ``guidance_scale`` and ``eval_num_steps`` from the module and the reward callbacks from the
trainer. Every sample it draws starts from :func:`~flowrl.sampling.sampler.seeded_noise` of its seed, so the same
(prompt, seed) gives the same image on any number of processes and in any batch.
"""

from __future__ import annotations

import sys
import warnings
from typing import Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from tqdm import tqdm

from flowrl.policies.base import Conditioning
from flowrl.rewards.aggregate import tally_means
from flowrl.rewards.reward_set import RewardSet, batch_metadata
from flowrl.sampling.sampler import VelocityFn, sample
from flowrl.sampling.solver import solver_sample
from flowrl.sampling.steps import ODE_STEPS

# ModelCheckpoint warns under manual optimization that checkpoints hold the weights after the optimizer step: that is
# what resuming an RL run needs (the next batch samples from the updated policy; tests/cli/test_fit.py resumes exactly)
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")


class Generation(LightningModule):
    """Generation, validation and prediction of a method (see the module docstring); not a method by itself."""

    scores_own_rewards = True  # reward callbacks must not score validation outputs a second time
    _reward_set: Optional[tuple[int, RewardSet]] = None
    forward_passes = 0  # rows through the model since the module was built (a CFG pair: 2); the loop reads deltas

    @property
    def reward_set(self) -> RewardSet:
        """The reward callbacks on the trainer as one :class:`~flowrl.rewards.reward_set.RewardSet` (built once per
        trainer)."""
        callbacks = self.trainer.callbacks
        if self._reward_set is None or self._reward_set[0] != id(callbacks):
            self._reward_set = (id(callbacks), RewardSet(callbacks))
        return self._reward_set[1]

    def encode(self, batch: dict) -> Conditioning:
        """The policy's conditioning of a batch's ``prompts`` and, where its prompt records carry them, ``images``."""
        return self.policy.encode(batch["prompts"], images=batch.get("images"))

    def velocity(self, z: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float,
                 cfg_gradient: str = "both") -> Tensor:
        """The policy's velocity (:meth:`~flowrl.policies.base.FlowPolicy.velocity`, under whatever adapter is
        active), counted in ``forward_passes``: a row per evaluation, 2 for a classifier-free guidance pair. Every
        model call of a method goes through here, so the update's passes are counted alike for every method."""
        self.forward_passes += len(z) * (2 if guidance_scale != 1.0 and cond.guided else 1)
        return self.policy.velocity(z, sigma, cond, guidance_scale, cfg_gradient)

    def velocity_fn(self, cond: Conditioning, rows_of: Optional[Tensor] = None) -> VelocityFn:
        """The policy's guided velocity as a :data:`~flowrl.sampling.sampler.VelocityFn` whose ``rows`` index
        ``cond``'s rows, or index ``rows_of`` (a rollout's ``cond_rows``: each row's conditioning row) where given."""
        def velocity(z: Tensor, sigma: Tensor, rows: Tensor) -> Tensor:
            if rows_of is not None:
                rows = rows_of[rows.to(rows_of.device)]
            return self.velocity(z, sigma, cond.select(rows), self.guidance_scale)
        return velocity

    @torch.no_grad()
    def generate(self, prompts: list[str], seeds: Tensor, num_steps: Optional[int] = None,
                 images: Optional[list] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` (videos ``[B, F, 3, H, W]``) decoded from :meth:`final_latents` of the prompts'
        conditioning; ``images``: the prompts' conditioning images, for an editing or image-to-video policy."""
        cond = self.encode({"prompts": prompts, "images": images})
        return self.policy.decode(self.final_latents(cond, seeds, num_steps))

    @torch.no_grad()
    def final_latents(self, cond: Conditioning, seeds: Tensor, num_steps: Optional[int] = None) -> Tensor:
        """Final latents ``[B, *latent_shape]`` of the deterministic sampler (no noise after the seeded start,
        ``eval_num_steps`` steps by default, ``guidance_scale``): the policy's own solver where its folder ships one
        (:meth:`~flowrl.policies.base.FlowPolicy.solver`: Wan's UniPC, as its pipeline steps), else flowrl's ODE step
        (Euler; DDIM for SD1.5), which is then the pipeline's."""
        sigmas = self.policy.sigmas(num_steps or self.eval_num_steps or self.num_steps).to(self.device)
        shape, solver = self.policy.latent_shape(), self.policy.solver()
        if solver is not None:
            return solver_sample(self.velocity_fn(cond), seeds, sigmas, shape, solver, self.device)
        latents, _ = sample(self.velocity_fn(cond), seeds, sigmas, shape, ODE_STEPS[self.policy.prediction],
                            device=self.device)
        return latents[:, -1]

    def _tally(self, batch: dict) -> dict[str, Tensor]:
        """The reward set's tally of the ODE samples of a batch's ``prompts`` from its ``seeds``."""
        images = self.generate(batch["prompts"], batch["seeds"].to(self.device), images=batch.get("images"))
        return self.reward_set.tally(self.reward_set.score(images, batch["prompts"], batch_metadata(batch)))

    def _reduced_means(self, tallies: list[dict[str, Tensor]]) -> dict[str, float]:
        """Means of the tallies summed over batches and then over ranks (one collective, the same on every rank even
        when ranks hold different numbers of batches)."""
        keys = self.reward_set.tally_keys()
        summed = torch.zeros(len(keys), dtype=torch.float64, device=self.device)
        for tally in tallies:
            summed += torch.stack([tally[k].double() for k in keys]).to(self.device)
        if self.trainer.world_size > 1:
            summed = self.trainer.strategy.reduce(summed, reduce_op="sum")
        return tally_means(dict(zip(keys, summed.cpu())))

    def on_validation_epoch_start(self) -> None:
        self._val_tallies: list[dict[str, Tensor]] = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._val_tallies.append(self._tally(batch))

    def on_validation_epoch_end(self) -> None:
        # already reduced over ranks; non-finite scores are left out of the means and counted, never scored as 0
        for name, value in self._reduced_means(self._val_tallies).items():
            self.log(f"val/reward/{name}", value, batch_size=1)

    @torch.no_grad()
    def evaluate(self, batches: list[dict], progress: Optional[str] = None) -> dict[str, float]:
        """Mean reward per name (and ``total``) over evaluation batches of ``prompts`` and ``seeds`` on every rank
        (call it on every rank), with ``<name>_nonfinite`` counts where scores were NaN or inf (left out of the means).
        ``progress``: a bar with this label on rank zero (validation can take minutes on a CPU).

        A SIGTERM stops it after the batch in progress (``SIGTERMException``, as Lightning's own loops stop): this
        loop runs inside a hook (the run summary's validation before training), where no Lightning loop looks."""
        was_training = self.policy.training
        self.policy.eval()
        shown = progress is not None and self.trainer.is_global_zero
        bar = tqdm(batches, desc=progress, disable=not shown, leave=False, file=sys.stdout, dynamic_ncols=True)
        shared = self.fewest_batches(len(batches))
        tallies = []
        try:
            for i, batch in enumerate(bar):
                tallies.append(self._tally(batch))
                if i < shared - 1 and self.sigterm_anywhere():  # every rank holds the next batch: stop together
                    raise SIGTERMException
            if self.sigterm_anywhere():  # before the means and whatever follows (a training batch)
                raise SIGTERMException
        finally:
            bar.close()
            self.policy.train(was_training)
        return self._reduced_means(tallies)

    def fewest_batches(self, count: int) -> int:
        """The fewest batches any rank holds (one collective): the stop decisions until then are shared, the same
        number on every rank."""
        if self.trainer.world_size == 1:
            return count
        fewest = self.trainer.strategy.reduce(torch.tensor(float(count), device=self.device), reduce_op="min")
        return int(fewest)

    def sigterm_anywhere(self) -> bool:
        """Rank zero's SIGTERM flag, on every rank (call it on every rank). The collective is the one Lightning's
        own SIGTERM handler makes on each rank (a broadcast of one number from rank zero, as its training loop's
        ``_broadcast_sigterm_tensor``), so a handler's broadcast on one rank pairs with this one on another; an
        all-reduce here met the handler's broadcast and broke the process group. Rank zero, Lightning's launcher,
        passes the signal on to the other processes."""
        flag = torch.tensor([int(self.trainer.received_sigterm)], device=self.trainer.strategy.root_device)
        if self.trainer.world_size > 1:
            torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """The images :meth:`generate` draws for ``batch["prompts"]`` from ``batch["seeds"]`` (deterministic ODE,
        ``eval_num_steps`` steps, ``guidance_scale``), scored by every reward callback on the trainer.

        Returns:
            the batch's keys, plus ``images`` ``[B, 3, H, W]`` in [0, 1] on the CPU and ``rewards`` ``{name: [B]}``
            (raw scores, NaN where a reward cannot read the prompt; empty without reward callbacks).
        """
        images = self.generate(batch["prompts"], batch["seeds"].to(self.device), images=batch.get("images"))
        scores = {}
        for reward in self.reward_set.callbacks:
            try:
                scores[reward.name] = reward.score(images, batch["prompts"], batch_metadata(batch)).float().cpu()
            except (ValueError, TypeError) as err:  # a prompt this reward cannot read: the images are still wanted
                rank_zero_warn(f"reward {reward.name!r} cannot score these prompts, its scores are NaN: {err}")
                scores[reward.name] = torch.full((len(batch["prompts"]),), torch.nan)
        return {**batch, "images": images.float().cpu(), "rewards": scores}
