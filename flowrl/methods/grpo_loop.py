"""The one training loop of every GRPO-family method, as a LightningModule with hooks.

``training_step`` = rollout (no grad) -> rewards from every reward callback -> advantages on the batch gathered
from all ranks -> ``num_inner_epochs`` of PPO-clip updates over shuffled (sample, trained step) micro-batches,
with gradient accumulation, manual clipping and one optimizer step per minibatch (manual optimization).
Methods override ``rollout``, ``step_rewards``, ``compute_advantages`` and ``loss_weights``, never the loop.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from contextlib import nullcontext
from typing import Any, Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from flowrl import advantages as adv_lib
from flowrl import losses
from flowrl.methods.micro_batches import Minibatch, rank_minibatches
from flowrl.methods.options import loss_problems, option_problems, resolved_loss_options
from flowrl.output_dirs import output_dir_problems
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.rewards.aggregate import aggregate, reward_tally, tally_means, weighted_sum
from flowrl.rewards.base import reward_callbacks
from flowrl.sampling.rollout import Rollout, sample, sde_steps, trained_steps
from flowrl.sampling.steps import ODE_STEPS, get_step

# ModelCheckpoint warns under manual optimization that checkpoints hold the weights after the optimizer step: that is
# what resuming a GRPO run needs (the next batch samples from the updated policy; tests/cli/test_fit.py resumes exactly)
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")


class GRPOLoop(LightningModule):
    """Shared loop. Arguments (all appear in ``python -m flowrl fit --help``):

    Args:
        policy: the policy adapter (``flowrl.policies.*``).
        num_steps: sampling steps ``T`` of a training rollout. eval_num_steps: ODE steps for validation.
        guidance_scale: classifier-free guidance at sampling and training (1 disables it).
        step_kind: SDE step (``flow_grpo``, ``cps``, ``dance``). noise_level: its noise scale ``a``.
        timestep_fraction: train the stochastic steps among the first ``floor(T * fraction)``.
        advantage: estimator or preset of ``flowrl.advantages``; advantage_options override its options.
        clip_range: PPO ratio clip ``epsilon`` (the loss's ``clip_low``). beta: KL coefficient to the reference
            policy (0 disables).
        loss: policy loss of ``flowrl.losses`` (``vanilla``, ``gspo``, ``gpg``, ``cispo``, ``sapo``); loss_options:
            its options, e.g. ``{clip_high: 2.0e-4, dual_clip: 3.0}``. A sequence-level loss (``gspo``) trains
            every trained step of a sample in one micro-batch (its ratio is the sample's geometric mean).
        num_inner_epochs: PPO epochs over one rollout batch. num_minibatches: optimizer steps per epoch.
        micro_batch_size: (sample, step) pairs per forward/backward. max_grad_norm: clip (None disables).
        optimizer: e.g. ``{class_path: torch.optim.AdamW, init_args: {lr: 3e-4}}``.
        seed: seeds the shuffling of training pairs.
        reward_aggregation: how the rewards combine (``flowrl.rewards.aggregate``): ``sum`` (weighted raw sum),
            ``advantage_sum`` (each normalised within its group, then weighted) or ``gdpo`` (then batch-normalised).
        sample_chunk_size: sample the batch in chunks of this many trajectories, submitting each chunk's images
            for scoring as soon as they exist (a ``RemoteReward`` with ``overlap`` scores them while the next chunk
            samples); results do not depend on it. None: one chunk.
        check_ratio: before the first update, recompute every trained step's log-prob with the unchanged weights,
            in the micro-batches the update uses, and log ``train/check_ratio_max_dev`` = max |ratio - 1| (on-policy
            it should be 0; batch-size-dependent kernels and low precision make it not; with recompute_log_probs it is
            measured against the recomputed log-probs). check_ratio_threshold: warn
            (rank zero) above this deviation (fp32 on CPU stays below 1e-5; bf16 on an H100: 1.2e-7 for the flow
            models, 1.6e-3 for SD1.5's DDIM).
        recompute_log_probs: before the update, replace the sampled log-probs of the trained steps by their values
            under the unchanged weights, computed in the update's own micro-batches (verl's ``old_log_prob``
            recomputation), so the first minibatch's ratios are exactly 1 whatever the sampling batch or precision;
            costs one extra forward pass over the trained steps.
        max_nonfinite_steps: an optimizer step whose loss or gradient norm is NaN or inf (on any rank) is skipped
            and counted (``train/nonfinite_steps``); this many skipped in a row stop the run with an error naming
            the quantity.
    """

    scores_own_rewards = True  # reward callbacks must not score validation outputs a second time

    def __init__(self, policy: FlowPolicy, num_steps: int = 10, eval_num_steps: Optional[int] = None,
                 guidance_scale: float = 4.5, step_kind: str = "flow_grpo", noise_level: float = 0.7,
                 timestep_fraction: float = 0.99, advantage: str = "grpo@flow_grpo",
                 advantage_options: Optional[dict[str, Any]] = None, clip_range: float = 1e-4,
                 loss: str = "vanilla", loss_options: Optional[dict[str, Any]] = None, beta: float = 0.0,
                 num_inner_epochs: int = 1, num_minibatches: int = 1, micro_batch_size: int = 16,
                 max_grad_norm: Optional[float] = 1.0, optimizer: OptimizerCallable = torch.optim.AdamW,
                 seed: int = 0, reward_aggregation: str = "sum", sample_chunk_size: Optional[int] = None,
                 check_ratio: bool = False, check_ratio_threshold: float = 1e-3, recompute_log_probs: bool = False,
                 max_nonfinite_steps: int = 3):
        super().__init__()
        problems = option_problems(num_steps=num_steps, step_kind=step_kind, timestep_fraction=timestep_fraction,
                                   num_inner_epochs=num_inner_epochs, num_minibatches=num_minibatches,
                                   micro_batch_size=micro_batch_size, advantage=advantage,
                                   advantage_options=advantage_options, reward_aggregation=reward_aggregation,
                                   sample_chunk_size=sample_chunk_size, policy=policy, noise_level=noise_level,
                                   beta=beta, max_nonfinite_steps=max_nonfinite_steps)
        problems += loss_problems(loss=loss, loss_options=loss_options, clip_range=clip_range)
        if problems:
            raise ValueError("invalid method settings:\n  " + "\n  ".join(problems))
        self.automatic_optimization = False
        self.policy = policy
        self.num_steps, self.eval_num_steps = num_steps, eval_num_steps or num_steps
        self.guidance_scale, self.step_kind, self.noise_level = guidance_scale, step_kind, noise_level
        self.timestep_fraction, self.clip_range, self.beta = timestep_fraction, clip_range, beta
        self.advantage, self.advantage_options = advantage, dict(advantage_options or {})
        self.loss, self.loss_options = loss, resolved_loss_options(loss, clip_range, loss_options)
        self.num_inner_epochs, self.num_minibatches = num_inner_epochs, num_minibatches
        self.micro_batch_size, self.max_grad_norm = micro_batch_size, max_grad_norm
        self.optimizer_factory, self.seed = optimizer, seed
        self.reward_aggregation, self.sample_chunk_size = reward_aggregation, sample_chunk_size
        self.check_ratio, self.check_ratio_threshold = check_ratio, check_ratio_threshold
        self.recompute_log_probs, self.max_nonfinite_steps = recompute_log_probs, max_nonfinite_steps
        self.nonfinite_in_a_row = 0  # skipped optimizer steps since the last finite one (checkpointed)
        if beta > 0:
            policy.setup_reference()

    def configure_optimizers(self):
        return self.optimizer_factory(self.policy.trainable_parameters())

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["flowrl_loop"] = {"nonfinite_in_a_row": self.nonfinite_in_a_row}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.nonfinite_in_a_row = checkpoint.get("flowrl_loop", {}).get("nonfinite_in_a_row", 0)

    def on_fit_start(self) -> None:
        if not reward_callbacks(self.trainer.callbacks):
            raise RuntimeError("no reward callback on the trainer: add one under trainer.callbacks, e.g. "
                               "{class_path: flowrl.rewards.DigitAlignment}")
        problems = output_dir_problems(self.trainer, self.trainer.is_global_zero)
        elsewhere = self.trainer.world_size > 1 and self.trainer.strategy.reduce_boolean_decision(
            bool(problems), all=False)  # every rank stops, or none: a rank left alone would wait in a collective
        if problems or elsewhere:
            raise PermissionError("output folders cannot be written (checked before the first rollout):\n  " +
                                  "\n  ".join(problems or ["on another rank; see its error"]))

    # -- hooks ---------------------------------------------------------------------------------------------

    def noise_levels(self) -> Tensor:
        """Per-step noise scale ``[T]`` (DenseGRPO calibrates it)."""
        return torch.full((self.num_steps,), float(self.noise_level))

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        """Sample the batch's trajectories with the SDE on every step."""
        sigmas = self.policy.sigmas(self.num_steps).to(self.device)
        mask = sde_steps(self.num_steps, self.step_kind)
        velocity = lambda z, s: self.policy.velocity(z, s, cond, self.guidance_scale)  # noqa: E731
        latents, log_probs = sample(velocity, batch["seeds"], sigmas, self.policy.latent_shape(), self.step_kind,
                                    self.noise_levels(), mask, self.device)
        batch_size = latents.shape[0]
        train = trained_steps(mask, self.timestep_fraction, sigmas.cpu(), self.step_kind).to(self.device)
        return Rollout(prompts=batch["prompts"], group_ids=batch["group_ids"], seeds=batch["seeds"],
                       latents=latents, log_probs=log_probs, sigmas=sigmas.expand(batch_size, -1),
                       train_mask=train.expand(batch_size, -1).clone(), nfe=self.num_steps)

    def step_rewards(self, rollout: Rollout, total: Tensor) -> Tensor:
        """Rewards ``[B, T]`` for the estimator: the outcome on the last trained step."""
        rewards = torch.zeros_like(rollout.log_probs)
        last = rollout.train_mask.float().cumsum(1).argmax(1)  # [B] last trained position
        rewards[torch.arange(len(total)), last] = total
        return rewards

    def compute_advantages(self, rewards: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
        """Advantages ``[B, T]`` on the global batch (identical on every rank)."""
        return adv_lib.compute(self.advantage, rewards, mask, group_ids, **self.advantage_options)

    def loss_weights(self, rollout: Rollout) -> Tensor:
        """Per (sample, step) loss weights ``[B, T]``."""
        return torch.ones_like(rollout.log_probs)

    # -- the loop ------------------------------------------------------------------------------------------

    def score(self, images: Tensor, prompts: list[str], metadata: Optional[dict] = None) -> dict[str, Tensor]:
        """Every reward callback's scores ``{name: [B]}``."""
        return {r.name: r.score(images, prompts, metadata) for r in reward_callbacks(self.trainer.callbacks)}

    def total_score(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Weighted total of every reward callback ``[B]`` (NaN where any reward is not finite), e.g. for the ODE
        completions of dense step-reward methods."""
        weights = {r.name: r.weight for r in reward_callbacks(self.trainer.callbacks)}
        total, valid = weighted_sum(self.score(images, prompts), weights)
        return torch.where(valid, total, torch.nan)

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        started = time.perf_counter()
        self.policy.eval()  # no dropout: sampling and training must see the same network
        with torch.no_grad():
            cond = self.policy.encode(batch["prompts"])
            rollout = self.rollout_and_score(batch, cond)
        sampling_s = time.perf_counter() - started
        weights = {r.name: r.weight for r in reward_callbacks(self.trainer.callbacks)}
        raw_total, _ = weighted_sum(rollout.rewards, weights)
        total, valid = self.aggregate_rewards(rollout, weights)
        advantages = self._global_advantages(rollout, total, valid)
        loss_weights = self.loss_weights(rollout) * valid[:, None]
        metrics = self.update(rollout, cond, advantages, loss_weights)
        self._log_step(rollout, raw_total, valid, advantages, metrics, sampling_s)
        return {"images": rollout.images, "prompts": rollout.prompts, "rewards": total, "seeds": rollout.seeds,
                "group_ids": rollout.group_ids, "advantages": advantages, "scores": rollout.rewards}

    def rollout_and_score(self, batch: dict, cond: Conditioning) -> Rollout:
        """The rollout with its images and every reward's scores, sampled ``sample_chunk_size`` rows at a time; each
        chunk is submitted for scoring (``RewardCallback.submit``) before the next one samples."""
        rewards, size = reward_callbacks(self.trainer.callbacks), len(batch["prompts"])
        parts, pending = [], []
        for start in range(0, size, self.sample_chunk_size or size):
            rows = range(start, min(start + (self.sample_chunk_size or size), size))
            chunk = {k: v[rows.start:rows.stop] if isinstance(v, (list, Tensor)) else v for k, v in batch.items()}
            part = self.rollout(chunk, cond.select(rows) if len(rows) < size else cond)
            part.images = self.policy.decode(part.latents[:, -1])
            meta = {"group_ids": part.group_ids, "seeds": part.seeds}
            pending.append({r.name: r.submit(part.images, part.prompts, meta) for r in rewards})
            parts.append(part)
        rollout = Rollout.cat(parts) if len(parts) > 1 else parts[0]
        rollout.rewards = {r.name: torch.cat([p[r.name].result() for p in pending]) for r in rewards}
        return rollout

    def aggregate_rewards(self, rollout: Rollout, weights: dict[str, float]) -> tuple[Tensor, Tensor]:
        """This rank's aggregated reward ``[B]`` and validity ``[B]``, normalised over the gathered batch."""
        scores = {name: self._gather(s) for name, s in rollout.rewards.items()}
        total, valid = aggregate(self.reward_aggregation, scores, weights, self._gather(rollout.group_ids))
        rank, local = self.trainer.global_rank, rollout.group_ids.shape[0]
        if self.trainer.world_size > 1:
            total, valid = total[rank * local:(rank + 1) * local], valid[rank * local:(rank + 1) * local]
        return total, valid

    def _gather(self, x: Tensor) -> Tensor:
        return self.all_gather(x).flatten(0, 1) if self.trainer.world_size > 1 else x

    def _global_advantages(self, rollout: Rollout, total: Tensor, valid: Tensor) -> Tensor:
        """Advantages from the gathered batch, then this rank's rows."""
        rewards = self._gather(self.step_rewards(rollout, total))
        mask, group_ids = self._gather(rollout.train_mask), self._gather(rollout.group_ids)
        ok = self._gather(valid)
        if not ok.any():
            names = [n for n, s in rollout.rewards.items() if not torch.isfinite(s).all()]
            raise RuntimeError(f"every sample of the batch got a non-finite reward from {names}; check the reward")
        advantages = torch.zeros_like(rewards)
        advantages[ok] = self.compute_advantages(rewards[ok], mask[ok], group_ids[ok])
        rank, local = self.trainer.global_rank, total.shape[0]
        return advantages[rank * local:(rank + 1) * local] if self.trainer.world_size > 1 else advantages

    def update(self, rollout: Rollout, cond: Conditioning, advantages: Tensor, weights: Tensor) -> dict[str, float]:
        """PPO epochs over (sample, trained step) pairs; one optimizer step per minibatch."""
        self.policy.train()
        opt = self.optimizers()
        pairs = rollout.train_mask.nonzero()  # [P, 2] (sample, step)
        # the minibatches are drawn from the pairs of every rank alike, so each rank takes the same optimizer steps
        # and a 2-process run trains the minibatches of a 1-process run; each rank computes its own rows' share
        global_pairs = self._gather(rollout.train_mask).nonzero()  # [P_global, 2]
        world, local = self.trainer.world_size, rollout.train_mask.shape[0]
        rows = (self.trainer.global_rank * local, (self.trainer.global_rank + 1) * local) if world > 1 else (0, -1)
        gen_seed = self.seed * 1_000_003 + self.global_step
        gen = torch.Generator().manual_seed(gen_seed)
        checked = {}
        first_epoch = [mb.micro for mb in self.minibatches(global_pairs, torch.Generator().manual_seed(gen_seed),
                                                           rows)]  # as the loop below draws it
        if self.recompute_log_probs:
            rollout = dataclasses.replace(rollout, log_probs=self.recomputed_log_probs(rollout, cond, first_epoch))
        if self.check_ratio and self.global_step == 0:
            checked["check_ratio_max_dev"] = self.on_policy_ratio_deviation(rollout, cond, advantages, weights,
                                                                            first_epoch)
        sums: dict[str, float] = {}
        extremes = {"ratio_min": float("inf"), "ratio_max": float("-inf")}
        grad_norms: list[float] = []
        skipped = 0
        for _ in range(self.num_inner_epochs):
            for minibatch in self.minibatches(global_pairs, gen, rows):
                losses_finite = True
                for i, chunk in enumerate(minibatch.micro):
                    last = i == len(minibatch.micro) - 1
                    with nullcontext() if last else self._no_sync():
                        loss, stats = self.pair_loss(rollout, cond, advantages, weights, chunk)
                        # DDP averages gradients over ranks: scaled so the result is the minibatch's mean
                        self.manual_backward(loss * (len(chunk) * world) / minibatch.size)
                    losses_finite &= bool(torch.isfinite(loss))
                    extremes["ratio_min"] = min(extremes["ratio_min"], stats.pop("ratio_min"))
                    extremes["ratio_max"] = max(extremes["ratio_max"], stats.pop("ratio_max"))
                    for key, value in stats.items():
                        sums[key] = sums.get(key, 0.0) + value * len(chunk)
                if not minibatch.micro:  # none of this minibatch's pairs are here: join its gradient sync with zeros
                    self.manual_backward(sum(p.sum() for p in self.policy.trainable_parameters()) * 0.0)
                grad_norm = self._grad_norm()
                if self._skip_nonfinite_step(losses_finite, grad_norm):
                    opt.zero_grad()
                    skipped += 1
                    continue
                grad_norms.append(grad_norm)
                if self.max_grad_norm is not None:
                    self.clip_gradients(opt, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
                opt.step()
                opt.zero_grad()
        count = max(len(pairs), 1) * self.num_inner_epochs
        out = {key: value / count for key, value in sums.items()}
        if len(pairs):  # a rank may hold no trained pair of this batch
            out.update(extremes, ratio_max_dev=max(extremes["ratio_max"] - 1, 1 - extremes["ratio_min"]))
        # before clipping, mean over the optimizer steps taken
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["nonfinite_steps"] = float(skipped)
        return {**out, **checked}

    def _skip_nonfinite_step(self, loss_finite: bool, grad_norm: float) -> bool:
        """Whether to skip this optimizer step (a non-finite loss or gradient norm on any rank: one collective, so
        every rank decides alike); raises after ``max_nonfinite_steps`` skipped in a row."""
        bad = not (loss_finite and math.isfinite(grad_norm))
        if self.trainer.world_size > 1:
            bad = self.trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            self.nonfinite_in_a_row = 0
            return False
        self.nonfinite_in_a_row += 1
        if self.nonfinite_in_a_row >= self.max_nonfinite_steps:
            quantity = "the loss" if not loss_finite else "the gradient norm" if not math.isfinite(grad_norm) else (
                "the loss or gradient norm on another rank")
            raise FloatingPointError(
                f"{quantity} was NaN or inf at {self.nonfinite_in_a_row} optimizer steps in a row (the last at "
                f"global step {self.global_step}); those steps were skipped and the weights are unchanged since the "
                "last finite one. Usual causes: a learning rate too high (model.optimizer.init_args.lr), fp16 "
                "overflow (use bf16 or 32-true precision), or a reward or noise setting that makes log-probs "
                f"non-finite. Stopping (model.max_nonfinite_steps={self.max_nonfinite_steps}).")
        rank_zero_warn(f"skipped optimizer step {self.global_step}: non-finite {'loss' if not loss_finite else 'gradient'}"
                       f" ({self.nonfinite_in_a_row} in a row; the run stops at model.max_nonfinite_steps="
                       f"{self.max_nonfinite_steps})")
        return True

    @torch.no_grad()
    def on_policy_ratio_deviation(self, rollout: Rollout, cond: Conditioning, advantages: Tensor, weights: Tensor,
                                  epoch: list[list[Tensor]]) -> float:
        """max |ratio - 1| over every trained pair with the unchanged weights, in the update's micro-batches ``epoch``
        (the first epoch's, so each pair is recomputed in the same batch composition as its first training pass).
        Warns on rank zero above ``check_ratio_threshold``."""
        deviation = 0.0
        for micro in epoch:
            for chunk in micro:
                _, stats = self.pair_loss(rollout, cond, advantages, weights, chunk)
                deviation = max(deviation, stats["ratio_max"] - 1, 1 - stats["ratio_min"])
        if deviation > self.check_ratio_threshold:
            rank_zero_warn(f"check_ratio: max |ratio - 1| = {deviation:.3g} with unchanged weights exceeds "
                           f"check_ratio_threshold={self.check_ratio_threshold:g}; the recomputed log-probs differ "
                           "from the sampled ones (precision, batch-size-dependent kernels or dropout), so clipping "
                           "will fire off-policy. Try autocast null / float32, or a larger clip_range.")
        return deviation

    @torch.no_grad()
    def recomputed_log_probs(self, rollout: Rollout, cond: Conditioning, epoch: list[list[Tensor]]) -> Tensor:
        """The rollout's log-probs with every trained pair's replaced by its value under the current weights,
        computed in the micro-batches ``epoch`` (the update's first epoch, so each pair in its batch composition)."""
        log_probs = rollout.log_probs.clone()
        for micro in epoch:
            for chunk in micro:
                log_probs[chunk[:, 0], chunk[:, 1]] = self._transition(rollout, cond, chunk).log_prob
        return log_probs

    def _transition(self, rollout: Rollout, cond: Conditioning, pairs: Tensor):
        """The sampler step of ``pairs [P, 2]`` (sample, step) from its recorded latents, with the policy's velocity
        (the reference's inside ``policy.reference()``): its mean, std and the log-prob of the recorded next latent."""
        b, k = pairs[:, 0], pairs[:, 1]
        z, sigma = rollout.latents[b, k], rollout.sigmas[b, k]
        velocity = self.policy.velocity(z, sigma, cond.select(b), self.guidance_scale)
        return get_step(self.step_kind)(z, velocity, sigma, rollout.sigmas[b, k + 1], z_next=rollout.latents[b, k + 1],
                                        noise_level=self.noise_levels().to(self.device)[k])

    def minibatches(self, pairs: Tensor, gen: torch.Generator, rows: tuple[int, int] = (0, -1)) -> list[Minibatch]:
        """One epoch of the gathered ``pairs`` shuffled into minibatches, this rank's ``rows`` of each in
        micro-batches (``flowrl.methods.micro_batches``); whole samples for ``gspo``."""
        return rank_minibatches(pairs, gen, self.num_minibatches, self.micro_batch_size,
                                whole_samples=losses.is_sequence_level(self.loss), rows=rows)

    def micro_batches(self, pairs: Tensor, gen: torch.Generator) -> list[list[Tensor]]:
        """One epoch of one rank's shuffled micro-batches per minibatch."""
        return [mb.micro for mb in self.minibatches(pairs, gen)]

    def _no_sync(self):
        """Skip the gradient all-reduce of a non-final micro-batch (DDP); a no-op on one device."""
        block = getattr(self.trainer.strategy, "block_backward_sync", None)
        return block() if block is not None else nullcontext()

    def _grad_norm(self) -> float:
        grads = [p.grad for p in self.policy.trainable_parameters() if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0

    def pair_loss(self, rollout: Rollout, cond: Conditioning, advantages: Tensor, weights: Tensor,
                  pairs: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Mean policy loss (+ beta KL) over ``pairs [P, 2]`` and its diagnostics.

        The pairs are laid out as ``[R, T]`` rows (one per sample of the micro-batch) for ``flowrl.losses``, so a
        sequence-level loss sees each sample's trained steps together; the reduction is the weighted mean over pairs.
        """
        b, k = pairs[:, 0], pairs[:, 1]
        out = self._transition(rollout, cond, pairs)
        samples, row = b.unique(return_inverse=True)
        shape = (len(samples), rollout.num_steps)
        as_rows = lambda x: x.new_zeros(shape).index_put((row, k), x)  # noqa: E731  [P] -> [R, T]
        loss, stats = losses.policy_loss(self.loss, as_rows(out.log_prob), as_rows(rollout.log_probs[b, k]),
                                         as_rows(advantages[b, k]), as_rows(torch.ones_like(b, dtype=torch.bool)),
                                         **self.loss_options)
        w = weights[b, k]  # [P]
        per_pair = loss[row, k]  # [P]
        metrics = {key: value.item() for key, value in stats.items()}
        if self.beta > 0:
            with torch.no_grad(), self.policy.reference():
                ref = self._transition(rollout, cond, pairs)
            kl = losses.gaussian_mean_kl(out.mean, ref.mean, out.std)  # [P]
            per_pair = per_pair + self.beta * kl
            metrics["kl"] = kl.mean().item()
        metrics["loss"] = (per_pair * w).mean().item()
        return (per_pair * w).mean(), metrics

    def _log_step(self, rollout, total, valid, advantages, metrics, sampling_s) -> None:
        size = total.shape[0]
        log = lambda name, value, **kw: self.log(name, value, batch_size=size, **kw)  # noqa: E731
        for name, scores in rollout.rewards.items():
            finite = torch.isfinite(scores)
            log(f"train/reward/{name}", scores[finite].mean() if finite.any() else torch.nan, sync_dist=True)
            if not finite.all():
                log(f"train/reward/{name}_nonfinite", (~finite).sum().float(), reduce_fx="sum", sync_dist=True)
        log("train/reward/total", total[valid].mean() if valid.any() else torch.nan, prog_bar=True, sync_dist=True)
        trained = advantages[rollout.train_mask]
        log("train/advantage/mean", trained.mean())
        log("train/advantage/std", trained.std() if trained.numel() > 1 else torch.zeros(()))
        for key, value in metrics.items():
            log(f"train/{key}", value)
        log("rollout/nfe", float(rollout.nfe))
        transitions = int(rollout.train_mask.sum())  # the batch's evaluations per transition the loss trains
        log("rollout/nfe_per_trained_step", rollout.nfe * size / transitions if transitions else float("nan"))
        log("rollout/samples_per_s", size / max(sampling_s, 1e-9))

    # -- evaluation ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[str], seeds: Tensor, num_steps: Optional[int] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` from the deterministic ODE sampler (no noise after the seeded start)."""
        cond = self.policy.encode(prompts)
        sigmas = self.policy.sigmas(num_steps or self.eval_num_steps).to(self.device)
        velocity = lambda z, s: self.policy.velocity(z, s, cond, self.guidance_scale)  # noqa: E731
        ode = ODE_STEPS[self.policy.prediction]
        latents, _ = sample(velocity, seeds, sigmas, self.policy.latent_shape(), ode, device=self.device)
        return self.policy.decode(latents[:, -1])

    def _tally(self, prompts: list[str], seeds: Tensor) -> dict[str, Tensor]:
        """``reward_tally`` of the ODE samples of ``prompts`` from ``seeds``."""
        images = self.generate(prompts, seeds.to(self.device))
        weights = {r.name: r.weight for r in reward_callbacks(self.trainer.callbacks)}
        return reward_tally(self.score(images, prompts), weights)

    def _reduced_means(self, tallies: list[dict[str, Tensor]]) -> dict[str, float]:
        """Means of the tallies summed over batches and then over ranks (one collective, the same on every rank even
        when ranks hold different numbers of batches)."""
        names = [r.name for r in reward_callbacks(self.trainer.callbacks)] + ["total"]
        keys = [f"{n}{suffix}" for n in names for suffix in ("", "/count", "/nonfinite")]
        summed = torch.zeros(len(keys), dtype=torch.float64, device=self.device)
        for tally in tallies:
            summed += torch.stack([tally[k].double() for k in keys]).to(self.device)
        if self.trainer.world_size > 1:
            summed = self.trainer.strategy.reduce(summed, reduce_op="sum")
        return tally_means(dict(zip(keys, summed.cpu())))

    def on_validation_epoch_start(self) -> None:
        self._val_tallies: list[dict[str, Tensor]] = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._val_tallies.append(self._tally(batch["prompts"], batch["seeds"]))

    def on_validation_epoch_end(self) -> None:
        # already reduced over ranks; non-finite scores are left out of the means and counted, never scored as 0
        for name, value in self._reduced_means(self._val_tallies).items():
            self.log(f"val/reward/{name}", value, batch_size=1)

    @torch.no_grad()
    def evaluate(self, batches: list[dict]) -> dict[str, float]:
        """Mean reward per name (and ``total``) over evaluation batches of ``prompts`` and ``seeds`` on every rank
        (call it on every rank), with ``<name>_nonfinite`` counts where scores were NaN or inf (left out of the means).
        """
        was_training = self.policy.training
        self.policy.eval()
        tallies = [self._tally(batch["prompts"], batch["seeds"]) for batch in batches]
        self.policy.train(was_training)
        return self._reduced_means(tallies)
