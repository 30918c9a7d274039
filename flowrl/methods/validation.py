"""Validation, evaluation and prediction of a method, reduced over ranks: the Lightning hooks that read the module's
:class:`~flowrl.methods.generation.Generation` (``self.generation``), its collectives
(:class:`~flowrl.methods.distributed.Ranks`, ``self.ranks``) and the reward callbacks on the trainer.

:class:`Validation` is the base module's parent (:class:`~flowrl.methods.base.BaseModule` adds the training loop).
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

from flowrl.rewards.aggregate import tally_means
from flowrl.rewards.reward_set import RewardSet, batch_metadata

# ModelCheckpoint warns under manual optimization that checkpoints hold the weights after the optimizer step: that is
# what resuming an RL run needs (the next batch samples from the updated policy; tests/cli/test_fit.py resumes exactly)
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")


class RewardSetOwner:
    """The reward callbacks on the trainer as one :class:`~flowrl.rewards.reward_set.RewardSet`, built once per
    trainer (the module's and the evaluator's ``reward_set``)."""

    _reward_set: Optional[tuple[int, RewardSet]] = None

    @property
    def reward_set(self) -> RewardSet:
        callbacks = self.trainer.callbacks
        if self._reward_set is None or self._reward_set[0] != id(callbacks):
            self._reward_set = (id(callbacks), RewardSet(callbacks))
        return self._reward_set[1]


class Validation(RewardSetOwner, LightningModule):
    """Validation, evaluation and prediction of a method (see the module docstring); not a method by itself."""

    scores_own_rewards = True  # reward callbacks must not score validation outputs a second time

    def _tally(self, batch: dict) -> dict[str, Tensor]:
        """The reward set's tally of the ODE samples of a batch's ``prompts`` from its ``seeds``."""
        images = self.generation.generate(batch["prompts"], batch["seeds"].to(self.device), images=batch.get("images"))
        return self.reward_set.tally(self.reward_set.score(images, batch["prompts"], batch_metadata(batch)))

    def _reduced_means(self, tallies: list[dict[str, Tensor]]) -> dict[str, float]:
        """Means of the tallies summed over batches and then over replicas (one collective, the same on every rank even
        when ranks hold different numbers of batches)."""
        keys = self.reward_set.tally_keys()
        summed = torch.zeros(len(keys), dtype=torch.float64, device=self.device)
        for tally in tallies:
            summed += torch.stack([tally[k].double() for k in keys]).to(self.device)
        if self.trainer.world_size > 1:  # each replica once (a context-parallel group's processes tally alike)
            summed = self.trainer.strategy.reduce(self.ranks.once(summed), reduce_op="sum")
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
        ranks = self.ranks
        shared = ranks.fewest_batches(len(batches))
        tallies = []
        try:
            for i, batch in enumerate(bar):
                tallies.append(self._tally(batch))
                if i < shared - 1 and ranks.sigterm_anywhere():  # every rank holds the next batch: stop together
                    raise SIGTERMException
            if ranks.sigterm_anywhere():  # before the means and whatever follows (a training batch)
                raise SIGTERMException
        finally:
            bar.close()
            self.policy.train(was_training)
        return self._reduced_means(tallies)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """The images :meth:`~flowrl.methods.generation.Generation.generate` draws for ``batch["prompts"]`` from
        ``batch["seeds"]`` (deterministic ODE, ``eval_num_steps`` steps, ``guidance_scale``), scored by every reward
        callback on the trainer.

        Returns:
            the batch's keys, plus ``images`` ``[B, 3, H, W]`` in [0, 1] on the CPU and ``rewards`` ``{name: [B]}``
            (raw scores, NaN where a reward cannot read the prompt; empty without reward callbacks).
        """
        images = self.generation.generate(batch["prompts"], batch["seeds"].to(self.device), images=batch.get("images"))
        scores = {}
        for reward in self.reward_set.callbacks:
            try:
                scores[reward.name] = reward.score(images, batch["prompts"], batch_metadata(batch)).float().cpu()
            except (ValueError, TypeError) as err:  # a prompt this reward cannot read: the images are still wanted
                rank_zero_warn(f"reward {reward.name!r} cannot score these prompts, its scores are NaN: {err}")
                scores[reward.name] = torch.full((len(batch["prompts"]),), torch.nan)
        return {**batch, "images": images.float().cpu(), "rewards": scores}
