"""Methods that train on the forward process (DiffusionNFT, AWM): only each rollout's clean latent is kept, noised
again at a few of the schedule's noise levels, and regressed there; no per-step log-prob is read, so any sampler
serves the rollout (the policy's ODE by default, CFG-free by default).

Two LoRA adapters on one backbone: the policy's own ``default`` (trained, evaluated, averaged by ``EMA``, exported)
and ``old``, the sampling policy, a frozen copy soft-updated after every batch, ``old <- d old + (1 - d) policy``
with the decay schedule of :class:`OldDecay`. The reference for the ``beta`` term is the backbone without adapters.

One training step = one batch: ``old`` samples; the images are scored and given group advantages; each sample trains
at ``times_per_sample`` of the schedule's noise levels (:meth:`ForwardProcess.level_ids`) on freshly noised copies
``x_t = (1 - t) x0 + t eps`` (the noise a function of (seed, step, row seed, level), so old and new see the same),
with the method's :meth:`~ForwardProcess.pair_loss`, in ``num_minibatches`` optimizer steps over the batch of every
rank. Randomness is a function of (seed, step, row seed), so resume is exact and 2 ranks equal 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.methods.base import BaseModule
from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least, named_adapter_problems
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import branch_seed, fraction_problems, fraction_steps, seeded_noise
from flowrl.sampling.steps import ODE_STEPS, PREDICTIONS, STEPS
from flowrl.training.adapter_steps import adapter_step, backward, follow
from flowrl.losses.nft import old_decay


@dataclass
class OldDecay:
    """The sampling policy's soft-update decay after ``n`` optimizer steps: 0 before ``delay``, then
    ``min((n - delay) rate, limit)``. DiffusionNFT's ``decay_type`` 1 (default): ``(0, 0.001, 0.5)``; 2 (OCR):
    ``(75, 0.0075, 0.999)``; 0: ``(0, 0, 0)``, the old policy is the current one.

    Args:
        delay: optimizer steps during which the old policy is the current one (decay 0).
        rate: the decay's growth per optimizer step after ``delay``.
        limit: the decay's ceiling, in [0, 1).
    """

    delay: int = 0
    rate: float = 0.001
    limit: float = 0.5


class ForwardProcess(BaseModule):
    """The forward-process update shared by DiffusionNFT and AWM. Options beyond the base's:

    Args:
        guidance_scale: the sampler's classifier-free guidance (1: CFG-free).
        step_kind: the sampler step (null: the policy's ODE; ``flow_grpo``, ``cps``, ``dance`` sample an SDE).
        noise_level: the SDE's noise scale (SDE steps only).
        beta: weight of ``mean((v - v_ref)^2)`` to the reference.
        advantage_clip: advantages are clipped to +-this.
        timestep_fraction: the fraction of the schedule's noise levels a sample may train at.
        num_minibatches: optimizer steps per batch.
        micro_batch_size: (sample, noise level) pairs per forward pass (None: a minibatch's pairs at once).
        old_decay: the soft update of the sampling policy ``old`` after each batch.
    """

    named_adapters = ("old",)  # the sampling policy, beside the trained ``default``

    def __init__(self, policy: FlowPolicy, guidance_scale: float = 1.0, step_kind: Optional[str] = None,
                 noise_level: float = 0.7, beta: float = 1e-4, advantage_clip: float = 5.0,
                 timestep_fraction: float = 0.99, num_minibatches: int = 1, micro_batch_size: Optional[int] = None,
                 old_decay: OldDecay = OldDecay(), **kwargs: Any):
        super().__init__(policy, guidance_scale=guidance_scale, **kwargs)
        self.step_kind = step_kind or self.step_kind  # the base's: the policy's ODE
        self.noise_level, self.beta, self.advantage_clip = noise_level, beta, advantage_clip
        self.timestep_fraction, self.num_minibatches = timestep_fraction, num_minibatches
        self.micro_batch_size, self.old_decay = micro_batch_size, old_decay

    def setup_weights(self) -> None:
        super().setup_weights()
        self.policy.add_adapter(self.named_adapters[0], self.policy.lora, trainable=False)
        follow(self.policy, "old", "default", 0.0)  # a copy

    def problems(self) -> list[str]:
        problems = super().problems() + named_adapter_problems(self.policy, type(self).__name__)
        velocity_kinds = sorted(k for k, p in PREDICTIONS.items() if p == "velocity" and k in STEPS)
        own_ode = ODE_STEPS[getattr(self.policy, "prediction", "velocity")]  # what step_kind null samples with
        if self.step_kind not in velocity_kinds and self.step_kind != own_ode:
            problems.append(f"model.step_kind={self.step_kind!r}: choose a sampler step from {velocity_kinds} (null: "
                            "the ODE)")
        problems += at_least(self, 0, ("advantage_clip", "noise_level"), strict=True)
        problems += at_least(self, 0, ("beta",)) + at_least(self, 1, ("num_minibatches",))
        problems += at_least(self, 1, ("micro_batch_size",), hint=" (or null: a minibatch's pairs at once)")
        problems += fraction_problems(self.timestep_fraction)
        decay = (self.old_decay.get("init_args", self.old_decay) if isinstance(self.old_decay, dict)
                 else vars(self.old_decay))
        if not (decay.get("delay", 0) >= 0 and decay.get("rate", 0) >= 0 and 0 <= decay.get("limit", 0) < 1):
            problems.append(f"model.old_decay={decay}: need delay >= 0, rate >= 0 and 0 <= limit < 1 (DiffusionNFT's "
                            "type 1: {delay: 0, rate: 0.001, limit: 0.5})")
        return problems

    def noise_levels(self) -> Tensor:
        """Per-step noise scale ``[T]`` of an SDE sampler (unused by the ODE)."""
        return torch.full((self.num_steps,), float(self.noise_level))

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        """The sampling policy ``old`` samples (the loop's rollout under the adapter ``old``)."""
        with self.policy.adapter("old"):
            return super().rollout(batch, cond)

    def sample_targets(self, advantages: Tensor, valid: Tensor) -> Tensor:
        """What :meth:`pair_loss` reads of each of this rank's samples ``[B]`` (``valid``: a finite reward)."""
        raise NotImplementedError

    def times_per_sample(self, num_levels: int) -> int:
        """How many of the schedule's ``num_levels`` noise levels each sample trains at."""
        return max(1, fraction_steps(num_levels, self.timestep_fraction))  # at least one level per sample

    def level_ids(self, seed: Tensor, num_levels: int, count: int) -> Tensor:
        """The ``count`` noise levels ``[count]`` a sample trains at this step: a random subset (DiffusionNFT's
        ``torch.randperm`` per sample)."""
        return torch.randperm(num_levels, generator=torch.Generator().manual_seed(
            branch_seed(int(seed), [self.seed, self.global_step])))[:count]

    def update(self, rollout: Rollout, cond: Conditioning, batch: Batch) -> dict[str, float]:
        """``num_minibatches`` optimizer steps over the samples of every rank, each sample at its drawn noise levels,
        then the soft update of ``old``."""
        all_advantages = batch.advantages[:, -1]  # [B_all] the outcome's, every rank
        valid, rows = batch.mine(batch.valid), batch.rows
        r = self.sample_targets(all_advantages[rows], valid)
        levels = rollout.sigmas[0, :-1]  # [T] the schedule's noise levels (the code: the sampler's timesteps / 1000)
        per_row = self.times_per_sample(len(levels))
        steps = self.training_steps()
        world = steps.world_size  # data-parallel replicas (a context-parallel group trains its rows as one)
        gen = torch.Generator().manual_seed(branch_seed(self.seed, [self.global_step]))
        order = torch.randperm(len(all_advantages), generator=gen)  # global rows, shuffled (as the code)
        losses, norms = [], []
        for part in order.chunk(self.num_minibatches):
            mine = part[(part >= rows.start) & (part < rows.stop)] - rows.start
            pair_rows = mine.repeat_interleave(per_row)
            ids = torch.cat([self.level_ids(rollout.seeds[i], len(levels), per_row) for i in mine.tolist()]
                            or [mine])  # [P] which noise level each pair trains at
            total = len(part) * per_row  # the minibatch's pairs on every rank
            finite = True
            for chunk in torch.arange(len(pair_rows)).split(self.micro_batch_size or max(len(pair_rows), 1)):
                b, k = pair_rows[chunk], ids[chunk]
                loss = self.pair_loss(rollout.latents[b, -1], levels[k], r[b], cond.select(b), rollout.seeds[b], k)
                loss = loss * valid[b]  # a sample without a finite reward does not train
                backward(steps, loss.sum() * world / total)  # averaged over ranks: the minibatch's mean
                finite &= bool(torch.isfinite(loss).all())
                losses.append(loss.detach())
            norms.append(adapter_step(steps, self.optimizers(), self.policy.trainable_parameters("default"), finite))
        follow(self.policy, "old", "default", old_decay(self.global_step, self.old_decay.delay, self.old_decay.rate,
                                                        self.old_decay.limit))
        taken = [n for n in norms if n is not None]
        return {"loss": float(torch.cat(losses).mean()) if losses else float("nan"), "r_mean": float(r.mean()),
                "grad_norm": sum(taken) / len(taken) if taken else float("nan")}

    def noised(self, x0: Tensor, t: Tensor, seeds: Tensor, level_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(x_t, eps)`` of pairs: ``x_t = (1 - t) x0 + t eps`` with ``eps`` drawn from (row seed, step, level)."""
        noise = seeded_noise(torch.tensor([branch_seed(int(s), [self.seed, self.global_step, 1, int(k)])
                                           for s, k in zip(seeds.tolist(), level_ids.tolist())]),
                             self.policy.latent_shape(), 1, self.device)[:, 0]
        tt = t.view(-1, *[1] * (x0.dim() - 1))
        return (1 - tt) * x0 + tt * noise, noise

    def reference_term(self, v: Tensor, x_t: Tensor, t: Tensor, cond) -> Tensor:
        """``beta mean((v - v_ref)^2)`` per pair ``[P]``, ``v_ref`` the backbone's without adapters."""
        with torch.no_grad(), self.policy.reference():
            v_ref = self.generation.velocity(x_t, t, cond, 1.0)
        return self.beta * (v - v_ref).square().flatten(1).mean(1)

    def pair_loss(self, x0: Tensor, t: Tensor, r: Tensor, cond, seeds: Tensor, level_ids: Tensor) -> Tensor:
        """The loss ``[P]`` of (sample, noise level) pairs; ``r`` their :meth:`sample_targets`."""
        raise NotImplementedError
