"""How a batch is sampled, the sampling hooks of :class:`~flowrl.methods.base.BaseModule`: trajectories from
seeded noise through the one step loop, which steps are stochastic (``sde_mask``) and which carry credit
(``trained_steps``), computed from the options alone so that the checks before loading see the same steps as the
run (``trained_step_mask``), the states whose ODE completions are scored (``completion_starts``), and the batch's
rollout sampled and scored ``sample_chunk_size`` rows at a time (``rollout_and_score``)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from flowrl.methods.trained_pairs import placeholder_sigmas
from flowrl.methods.validation import Validation
from flowrl.policies.base import Conditioning
from flowrl.rewards.reward_set import row_metadata
from flowrl.sampling.multistep import MultistepTail
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import sample, sde_steps
from flowrl.sampling.steps import ODE_STEPS


class Trajectories(Validation):
    """The sampling hooks (reads the method's options, ``policy``, ``generation``, ``completions`` and
    ``reward_set``)."""

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        """Sample the batch's rows (conditioned by ``cond``'s rows ``batch["cond_rows"]``, by default row ``i`` by row
        ``i``) with the step kind's SDE on the ``sde_mask`` steps, then score the ODE completions of
        ``completion_starts``, each with its row's metadata (``batch["images"]``, like ``cond``, per conditioning
        row)."""
        sigmas = self.policy.sigmas(self.num_steps).to(self.device)
        mask = self.rollout_sde_mask(batch)
        cond_rows = batch.get("cond_rows", torch.arange(len(batch["seeds"]), device=self.device))
        reuse = self.completions is not None and self.completions.completion_steps == 0
        velocities = [] if reuse else None  # kept only for completions that reuse them
        grid = self.rollout_grid(mask)
        tail = self.ode_tail(mask, sigmas) if grid is None else self.ode_tail(mask[..., grid[:-1]], sigmas[grid])
        latents, log_probs = sample(self.generation.velocity_fn(cond, cond_rows), batch["seeds"], sigmas,
                                    self.policy.latent_shape(), self.step_kind, self.noise_levels(), mask, self.device,
                                    velocities, tail, grid)
        size = latents.shape[0]
        train = self.trained_steps(mask, sigmas.cpu()).to(self.device)
        rollout = Rollout(prompts=batch["prompts"], group_ids=batch["group_ids"], seeds=batch["seeds"],
                          latents=latents, log_probs=log_probs, sigmas=sigmas.expand(size, -1),
                          train_mask=train.expand(size, -1).clone(), cond_rows=cond_rows,
                          nfe=torch.full((size,), self.num_steps if grid is None else len(grid) - 1,
                                         device=self.device),
                          velocities=torch.stack(velocities, 1) if reuse else None)
        starts = self.completion_starts()
        if starts is not None:  # each completion scored with its trajectory's metadata (an edit: its sources)
            metadata = row_metadata(rollout.group_ids, rollout.seeds, rollout.cond_rows, batch.get("images"))
            rows_of = rollout.cond_rows  # a completion decodes with its trajectory's conditioning row
            decode = lambda z, rows: self.policy.decode(z, cond.select(rows_of[rows.to(rows_of.device)]))  # noqa: E731
            rollout.completion_rewards, nfe = self.completions.score(
                rollout, starts, self.generation.velocity_fn(cond, rows_of), decode,
                self.reward_set.row_scorer(metadata, size), ODE_STEPS[self.policy.prediction])
            rollout.nfe = rollout.nfe + nfe
        return rollout

    def rollout_and_score(self, batch: dict, cond: Conditioning) -> Rollout:
        """The rollout with its images and every reward's scores, sampled ``sample_chunk_size`` rows at a time; each
        chunk is submitted for scoring before the next one samples."""
        size = len(batch["prompts"])
        step = self.sample_chunk_size or size
        parts, pending = [], []
        for start in range(0, size, step):
            rows = slice(start, min(start + step, size))
            # images stay per conditioning row, as cond: a row (a leaf, a completion) finds its own by cond_rows
            chunk = {k: v[rows] if isinstance(v, (list, Tensor)) and k != "images" else v for k, v in batch.items()}
            chunk["cond_rows"] = torch.arange(rows.start, rows.stop, device=self.device)
            part = self.rollout(chunk, cond)
            part.images = self.policy.decode(part.final(), cond.select(part.cond_rows))
            metadata = row_metadata(part.group_ids, part.seeds, part.cond_rows, batch.get("images"))
            pending.append(self.reward_set.submit(part.images, part.prompts, metadata))
            parts.append(part)
        rollout = Rollout.cat(parts) if len(parts) > 1 else parts[0]
        rollout.rewards = self.reward_set.collect(pending)
        # scored, the images are only read by sample grids and dumps after the update: off the accelerator during it
        # (a batch of 4 Wan videos of 81 frames at 480p is 1.5 GB of float32 frames)
        rollout.images = rollout.images.cpu()
        return rollout

    def noise_levels(self) -> Tensor:
        """Per-step noise scale ``[T]`` of the SDE (none for a deterministic rollout)."""
        return torch.zeros(self.num_steps)

    def rollout_sde_mask(self, batch: dict) -> Tensor:
        """The stochastic steps of this batch's rollout, ``[T]`` or per row ``[B, T]`` (default: :meth:`sde_mask`;
        a schedule over training, MixGRPO's window or Flash-GRPO's step per group, overrides it)."""
        return self.sde_mask()

    def ode_tail(self, sde_mask: Tensor, sigmas: Tensor) -> Optional[MultistepTail]:
        """The multistep solver of the steps after the stochastic ones of ``sde_mask`` on the grid ``sigmas`` (None:
        the step kind's own ODE step everywhere; MixGRPO-Flash's DPM-Solver++ overrides it)."""
        return None

    def rollout_grid(self, sde_mask: Tensor) -> Optional[Tensor]:
        """The indices ``[n + 1]`` of the ``T + 1`` grid points at which a rollout with the stochastic steps
        ``sde_mask`` runs the model (None: every one; MixGRPO-Flash's coarser tail after the window overrides it);
        the states between are interpolated (:func:`~flowrl.sampling.coarse_tail.expand_to_grid`)."""
        return None

    def sde_mask(self) -> Tensor:
        """Which sampling steps are stochastic ``[T]`` (default: all, for an SDE ``step_kind``; none for an ODE
        one)."""
        return sde_steps(self.num_steps, self.step_kind)

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        """Which steps carry credit ``[T]`` on the schedule ``sigmas [T+1]``. A method that trains no log-prob
        (TDM-R1, DiffusionNFT) credits the outcome to the last step, the clean sample's."""
        return torch.arange(self.num_steps) == self.num_steps - 1

    def trained_step_mask(self) -> Tensor:
        """``[T]`` the steps on which a batch trains some (sample, step) pair, from the options alone (a placeholder
        schedule ``linspace(1, 0, T + 1)``: the real one is only read once the model's configs are, and differs in
        spacing only). The check before loading rejects options for which it is empty (:func:`~flowrl.methods.
        trained_pairs.untrained_problems`); a tree method reads its tree's shape."""
        return self.trained_steps(self.sde_mask(), placeholder_sigmas(self.num_steps))

    def completion_starts(self) -> Optional[Tensor]:
        """The states whose ODE completions are scored into ``completion_rewards`` (None: none)."""
        return None
