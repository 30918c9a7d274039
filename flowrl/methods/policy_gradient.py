"""Policy gradient on denoising trajectories: the loop every GRPO-family method shares, and the hooks they declare.

``training_step`` = rollout (no grad; sampled and scored ``sample_chunk_size`` rows at a time) -> the batch gathered
from every rank (its small per-row tensors: rewards, groups, masks, node ids) -> the hooks on it, computed once and
identically on every rank (step rewards, advantages, loss weights) -> this rank's rows -> the PPO update
(:class:`~flowrl.methods.ppo_update.PPOUpdate`). A method overrides the hooks it needs, never the loop:

- ``sde_mask`` / ``trained_steps`` / ``noise_levels``: which steps are stochastic, trained, and how noisy;
- ``rollout``: how a batch is sampled (plain trajectories by default; branches and trees fill ``node_ids``);
- ``completion_starts``: which states are completed with the ODE and scored (dense step-reward methods);
- ``step_rewards``, ``advantages``, ``loss_weights``: on the gathered batch, returning tensors. Hooks do not
  communicate and do not change the rollout.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl import advantages as adv_lib
from flowrl.methods.base import BaseModule, reward_metadata
from flowrl.methods.completions import Completions
from flowrl.methods.options import policy_gradient_problems, resolved_loss_options
from flowrl.methods.ppo_update import PPOUpdate
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import sample, sde_steps, trained_steps
from flowrl.sampling.steps import get_step, ode_kind

#: the per-row fields of a rollout that hooks see, gathered from every rank (latents and images stay where they are)
GATHERED = ("group_ids", "seeds", "log_probs", "sigmas", "train_mask", "completion_rewards", "node_ids", "nfe")


class PolicyGradient(BaseModule):
    """The shared loop. Options beyond the base's (:class:`~flowrl.methods.base.BaseModule`):

    Args:
        step_kind: the SDE step (``flow_grpo``, ``cps``, ``dance``; ``ddim`` for SD1.5).
        noise_level: the SDE's noise scale ``a``.
        advantage: estimator or preset of ``flowrl.advantages``.
        advantage_options: overrides of the estimator's options.
        clip_range: PPO ratio clip ``epsilon`` (the loss's ``clip_low``).
        loss: policy loss of ``flowrl.losses`` (``vanilla``, ``gspo``, ``gpg``, ``cispo``, ``sapo``).
        loss_options: the loss's options, e.g. ``{clip_high: 2.0e-4, dual_clip: 3.0}``. A sequence-level loss
            (``gspo``) trains every trained step of a sample in one micro-batch.
        beta: KL coefficient to the reference policy (0 disables).
        num_inner_epochs: PPO epochs over one rollout batch.
        num_minibatches: optimizer steps per epoch (``trainer.max_steps`` counts them).
        micro_batch_size: (sample, step) pairs per forward/backward.
        reward_aggregation: how the rewards combine (``flowrl.rewards.aggregate``): ``sum`` (weighted raw sum),
            ``advantage_sum`` (each normalised within its group, then weighted) or ``gdpo`` (then batch-normalised).
        sample_chunk_size: sample the batch in chunks of this many rows, submitting each chunk's images for scoring
            as soon as they exist (a ``RemoteReward`` with ``overlap`` scores them while the next chunk samples);
            results do not depend on it. None: one chunk.
        check_ratio: before the first update, recompute every trained step's log-prob with the unchanged weights in
            the update's micro-batches and log ``train/check_ratio_max_dev`` = max |ratio - 1| (0 on-policy).
        check_ratio_threshold: warn (rank zero) above this deviation (fp32 on CPU stays below 1e-5; bf16 on an H100:
            1.2e-7 for the flow models, 1.6e-3 for SD1.5's DDIM).
        recompute_log_probs: before the update, replace the sampled log-probs of the trained steps by their values
            under the unchanged weights in the update's own micro-batches (verl's ``old_log_prob``), so the first
            minibatch's ratios are exactly 1 whatever the sampling batch or precision; one extra forward pass.
    """

    option_problems = staticmethod(policy_gradient_problems)

    def __init__(self, policy: FlowPolicy, step_kind: str = "flow_grpo", noise_level: float = 0.7,
                 advantage: str = "grpo@flow_grpo", advantage_options: Optional[dict[str, Any]] = None,
                 clip_range: float = 1e-4, loss: str = "vanilla", loss_options: Optional[dict[str, Any]] = None,
                 beta: float = 0.0, num_inner_epochs: int = 1, num_minibatches: int = 1, micro_batch_size: int = 16,
                 reward_aggregation: str = "sum", sample_chunk_size: Optional[int] = None, check_ratio: bool = False,
                 check_ratio_threshold: float = 1e-3, recompute_log_probs: bool = False, **kwargs: Any):
        problems = policy_gradient_problems(
            step_kind=step_kind, noise_level=noise_level, advantage=advantage, advantage_options=advantage_options,
            clip_range=clip_range, loss=loss, loss_options=loss_options, beta=beta, num_inner_epochs=num_inner_epochs,
            num_minibatches=num_minibatches, micro_batch_size=micro_batch_size, reward_aggregation=reward_aggregation,
            sample_chunk_size=sample_chunk_size, policy=policy, **kwargs)
        if problems:
            raise ValueError("invalid method settings:\n  " + "\n  ".join(problems))
        # **kwargs passed on unchanged: jsonargparse reads the base's signature through it (--help, YAML checks)
        super().__init__(policy, **kwargs)
        self.step_kind, self.noise_level = step_kind, noise_level
        self.advantage, self.advantage_options = advantage, dict(advantage_options or {})
        self.reward_aggregation, self.sample_chunk_size = reward_aggregation, sample_chunk_size
        self.ppo = PPOUpdate(loss=loss, loss_options=resolved_loss_options(loss, clip_range, loss_options),
                             beta=beta, num_inner_epochs=num_inner_epochs, num_minibatches=num_minibatches,
                             micro_batch_size=micro_batch_size, check_ratio=check_ratio,
                             check_ratio_threshold=check_ratio_threshold, recompute_log_probs=recompute_log_probs)
        self.completions: Optional[Completions] = None  # dense step-reward methods set one
        self.unlogged_evaluations = 0.0  # evaluations spent outside rollouts (calibration), counted at the next log
        if beta > 0:
            policy.setup_reference()

    # -- hooks: sampling -----------------------------------------------------------------------------------

    def noise_levels(self) -> Tensor:
        """Per-step noise scale ``[T]`` (DenseGRPO calibrates it)."""
        return torch.full((self.num_steps,), float(self.noise_level))

    def sde_mask(self) -> Tensor:
        """Which sampling steps are stochastic ``[T]`` (default: all)."""
        return sde_steps(self.num_steps, self.step_kind)

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        """Which steps the loss trains ``[T]`` (default: every stochastic step with a non-zero std)."""
        return trained_steps(sde_mask, 1.0, sigmas, self.step_kind)

    def completion_starts(self) -> Optional[Tensor]:
        """The states whose ODE completions are scored into ``completion_rewards`` (None: none)."""
        return None

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        """Sample the batch's rows (conditioned by ``cond``'s rows ``batch["cond_rows"]``, by default row ``i`` by row
        ``i``) with the SDE on the ``sde_mask`` steps, then score the ODE completions of ``completion_starts``."""
        sigmas = self.policy.sigmas(self.num_steps).to(self.device)
        mask = self.sde_mask()
        cond_rows = batch.get("cond_rows", torch.arange(len(batch["seeds"]), device=self.device))
        reuse = self.completions is not None and self.completions.completion_steps == 0
        velocities = [] if reuse else None  # kept only for completions that reuse them
        latents, log_probs = sample(self.velocity_fn(cond, cond_rows), batch["seeds"], sigmas,
                                    self.policy.latent_shape(), self.step_kind, self.noise_levels(), mask, self.device,
                                    velocities)
        size = latents.shape[0]
        train = self.trained_steps(mask, sigmas.cpu()).to(self.device)
        rollout = Rollout(prompts=batch["prompts"], group_ids=batch["group_ids"], seeds=batch["seeds"],
                          latents=latents, log_probs=log_probs, sigmas=sigmas.expand(size, -1),
                          train_mask=train.expand(size, -1).clone(), cond_rows=cond_rows,
                          nfe=torch.full((size,), self.num_steps, device=self.device),
                          velocities=torch.stack(velocities, 1) if reuse else None)
        starts = self.completion_starts()
        if starts is not None:
            def by_row(z, sigma, rows):  # rows index the rollout; each carries its conditioning row
                return self.policy.velocity(z, sigma, cond.select(rollout.cond_rows[rows]), self.guidance_scale)

            rollout.completion_rewards, nfe = self.completions.score(
                rollout, starts, by_row, self.policy.decode, self.reward_set.total_score, ode_kind(self.step_kind))
            rollout.nfe = rollout.nfe + nfe
        return rollout

    # -- hooks: on the batch gathered from every rank -------------------------------------------------------

    def step_rewards(self, batch: Rollout, total: Tensor, valid: Tensor) -> Tensor:
        """Rewards ``[B, T]`` for the estimator: the outcome on each row's last trained step."""
        rewards = torch.zeros_like(batch.log_probs)
        last = batch.train_mask.float().cumsum(1).argmax(1)  # [B] last trained position
        rewards[torch.arange(len(total)), last] = total
        return rewards

    def advantages(self, batch: Rollout, rewards: Tensor, valid: Tensor) -> Tensor:
        """Advantages ``[B, T]`` of the valid rows (0 elsewhere). A tree estimator gets the rollout's ``node_ids``
        as its ``step_group_ids``."""
        extra = {} if batch.node_ids is None else {"step_group_ids": batch.node_ids[valid]}  # read by `tree`
        out = torch.zeros_like(rewards)
        out[valid] = adv_lib.compute(self.advantage, rewards[valid], batch.train_mask[valid],
                                     self.advantage_groups(batch)[valid], log_probs=batch.log_probs[valid],
                                     **self.advantage_options, **extra)
        return out

    def advantage_groups(self, batch: Rollout) -> Tensor:
        """The group id of each row, among which advantages are normalised (default: the prompt's group)."""
        return batch.group_ids

    def loss_weights(self, batch: Rollout) -> Tensor:
        """Per (row, step) loss weights ``[B, T]``."""
        return torch.ones_like(batch.log_probs)

    def supervised_weights(self, batch: Rollout, total: Tensor, valid: Tensor, advantages: Tensor) -> Optional[Tensor]:
        """Weights ``[B, T]`` of a likelihood term ``-w log p`` beside the policy loss (None: none; Dynamic-TreeRPO's
        LayerTuning-RL declares one)."""
        return None

    # -- the loop ------------------------------------------------------------------------------------------

    def transition(self, rollout: Rollout, cond: Conditioning, pairs: Tensor):
        """The sampler step of ``pairs [P, 2]`` (row, step) from its recorded latents, with the policy's velocity
        (the reference's inside ``policy.reference()``): its mean, std and the log-prob of the recorded next latent."""
        b, k = pairs[:, 0], pairs[:, 1]
        z, sigma = rollout.states(b, k), rollout.sigmas[b, k]
        velocity = self.policy.velocity(z, sigma, cond.select(rollout.cond_rows[b]), self.guidance_scale)
        return get_step(self.step_kind)(z, velocity, sigma, rollout.sigmas[b, k + 1], z_next=rollout.states(b, k + 1),
                                        noise_level=self.noise_levels().to(self.device)[k])

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        started = time.perf_counter()
        self.policy.eval()  # no dropout: sampling and training must see the same network
        with torch.no_grad():
            cond = self.encode(batch)
            rollout = self.rollout_and_score(batch, cond)
        sampling_s = time.perf_counter() - started
        sizes = self.rank_sizes(rollout.batch_size)
        view, mine = self.gathered(rollout, sizes), self.rank_rows(sizes)
        total, valid = self.reward_set.aggregate(self.reward_aggregation, view.rewards, view.group_ids)
        if view.completion_rewards is not None:  # a completion that could not be scored invalidates its row
            valid = valid & torch.isfinite(view.completion_rewards).all(1)
        if not valid.any():
            bad = [n for n, s in view.rewards.items() if not torch.isfinite(s).all()] or ["the ODE completions"]
            raise RuntimeError(f"every sample of the batch got a non-finite reward from {bad}; check the reward")
        step_rewards = self.step_rewards(view, total, valid)
        advantages = self.advantages(view, step_rewards, valid)
        weights = self.loss_weights(view) * valid[:, None]
        train_mask = view.trained_once()
        rollout.step_rewards, rollout.train_mask = step_rewards[mine], train_mask[mine]
        supervised = self.supervised_weights(view, total, valid, advantages)
        metrics = self.ppo.run(self, rollout, cond, advantages[mine], weights[mine], train_mask, mine,
                               seed=self.seed * 1_000_003 + self.global_step,
                               supervised=None if supervised is None else supervised[mine])
        raw_total = self.reward_set.total(rollout.rewards)[0]
        self._log_step(rollout, raw_total, valid[mine], advantages[mine], metrics, sampling_s)
        return {"images": rollout.images, "prompts": rollout.prompts, "rewards": total[mine], "seeds": rollout.seeds,
                "group_ids": rollout.group_ids, "advantages": advantages[mine], "scores": rollout.rewards,
                "node_ids": rollout.node_ids}

    def gathered(self, rollout: Rollout, sizes: list[int]) -> Rollout:
        """The rollout's per-row fields (no latents, images or prompts) from every rank, in rank order."""
        fields = {name: self.gather(getattr(rollout, name), sizes) if getattr(rollout, name) is not None else None
                  for name in GATHERED}  # cond_rows index each rank's own prompts: not gathered
        rewards = {name: self.gather(scores, sizes) for name, scores in rollout.rewards.items()}
        return Rollout(prompts=[], latents=None, rewards=rewards, **fields)

    def rollout_and_score(self, batch: dict, cond: Conditioning) -> Rollout:
        """The rollout with its images and every reward's scores, sampled ``sample_chunk_size`` rows at a time; each
        chunk is submitted for scoring before the next one samples."""
        size = len(batch["prompts"])
        step = self.sample_chunk_size or size
        parts, pending = [], []
        for start in range(0, size, step):
            rows = slice(start, min(start + step, size))
            chunk = {k: v[rows] if isinstance(v, (list, Tensor)) else v for k, v in batch.items()}
            chunk["cond_rows"] = torch.arange(rows.start, rows.stop, device=self.device)
            part = self.rollout(chunk, cond)
            part.images = self.policy.decode(part.final())
            rows_batch = {"group_ids": part.group_ids, "seeds": part.seeds}  # per rollout row (a tree: per leaf)
            if "images" in batch:  # each row's prompt's images, through the row's conditioning row
                rows_batch["images"] = [batch["images"][i] for i in part.cond_rows.tolist()]
            pending.append(self.reward_set.submit(part.images, part.prompts, reward_metadata(rows_batch)))
            parts.append(part)
        rollout = Rollout.cat(parts) if len(parts) > 1 else parts[0]
        rollout.rewards = self.reward_set.collect(pending)
        return rollout

    def _log_step(self, rollout: Rollout, total: Tensor, valid: Tensor, advantages: Tensor,
                  metrics: dict[str, float], sampling_s: float) -> None:
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
        nfe = float(rollout.nfe.sum()) / size  # mean model evaluations per row (a tree's leaf: its share)
        log("rollout/nfe", nfe)
        # the batch's model evaluations over every rank: the compute budget methods are compared at
        log("rollout/evaluations", rollout.nfe.sum().float() + self.unlogged_evaluations, reduce_fx="sum",
            sync_dist=True)
        self.unlogged_evaluations = 0.0
        transitions = int(rollout.train_mask.sum())  # the batch's evaluations per transition the loss trains
        log("rollout/nfe_per_trained_step", float(rollout.nfe.sum()) / transitions if transitions else float("nan"))
        log("rollout/samples_per_s", size / max(sampling_s, 1e-9))

