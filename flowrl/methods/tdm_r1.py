"""TDM-R1 (arXiv 2603.07700): reinforcing a few-step deterministic generator through a learned surrogate reward.

Three LoRA adapters on one backbone (Luo-Yihong/TDM-R1 ``scripts/train_tdmr1_pub.py``: ``tdm``, ``fake``, ``dgpo``):
the generator (the policy's own adapter ``default``: it samples, is evaluated, averaged by ``EMA(adapter=default)``
and exported with ``--adapter default``), the fake score ``fake_score`` of trajectory distribution matching, and the
surrogate reward ``surrogate``, a diffusion model whose denoising-loss gap to the reference (the backbone without
adapters) is the reward. ``surrogate_old``, a frozen copy trailing the surrogate (decay ``min(0.3, 0.001 + 0.001
step)``), supplies the PPO-style ratio.

One training step = one batch: the generator samples ``K = num_steps`` deterministic ODE steps without CFG; the final
images are scored and given group advantages (``grpo@flow_grpo``); then, for ``M = num_train_steps`` steps ``j`` drawn
from the K (the same on every rank), in this order:

1. fake score: denoise the generator's re-noised one-step sample (:func:`~flowrl.losses.tdm.fake_score_loss`);
2. surrogate (group preference, Eq. 7-9 as coded): per ``j`` a boundary ``b ~ p(b) ∝ b + 1``, its stored latent
   re-noised with noise shared by the group; weights ``sigmoid(s_g)`` of the group logits, rows frozen past
   ``1 ± clip_range`` or drifted (:mod:`flowrl.losses.tdm`), ``+ beta mean((v - v_ref)^2)``, times ``(b + 1) / K``;
3. generator (Eq. 10-11 as coded): x0 targets from CFG as a reward, distribution matching and the surrogate direction
   (:func:`~flowrl.losses.tdm.generator_loss`); steps ``j >= trunc_steps`` drop the surrogate term.

Each adapter takes one optimizer step per batch; only the generator's counts as a global step
(:mod:`flowrl.training.adapter_steps`). Re-noising times are drawn in unshifted time above the lower bound
(``time_shift``). Randomness is a function of (seed, step, row seed or group id), so resume is exact and 2 ranks
equal 1. Deviations from the code (see docs/methods/tdm_r1.md): Euler ODE rollouts on the policy's schedule (the code
uses DPM-Solver with flow shift 3), the drift test on the global batch's mean (the code: each GPU's), one optimizer
step per adapter per batch in the order fake, surrogate, generator (the code accumulates an epoch in accelerate).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.losses.tdm import (fake_score_loss, frozen_rows, generator_loss, group_logits, group_preference_loss,
                               renoise, renoise_sigma, surrogate_target)
from flowrl.methods.base import BaseModule
from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least, guidance_distillation_problems, named_adapter_problems
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import branch_seed, seeded_noise
from flowrl.training.adapter_steps import adapter_optimizers, adapter_step, backward, follow

#: the trained adapters, in optimizer order; the generator is the policy's own LoRA adapter
ADAPTERS = ("default", "fake_score", "surrogate")
OLD_DECAY = (0.001, 0.001, 0.3)  # surrogate_old: min(max, start + rate * step) (ema_old_decay_min / max)


class TDMR1(BaseModule):
    """TDM-R1. Options beyond the base's (``num_steps`` is K; ``guidance_scale`` must stay 1):

    Args:
        num_steps: K, the generator's deterministic ODE steps (training and evaluation).
        guidance_scale: 1: the generator samples without CFG (its CFG-as-reward term trains the guidance into it).
        num_train_steps: M, the steps of the K trained per batch (drawn without replacement).
        trunc_steps: steps ``j < trunc_steps`` get the surrogate reward term (None: all K).
        teacher_guidance: the CFG of the real score (the reference) in the CFG-as-reward term and the weight.
        surrogate_guidance: the CFG of the surrogate in the generator's reward direction (``rl_cfg``).
        tdm_weight: weight of the CFG-reward term; the surrogate term gets ``1 - tdm_weight``.
        beta: weight of the surrogate's ``mean((v - v_ref)^2)`` regulariser.
        beta_dpo: scale of the group logit.
        clip_range: freeze a surrogate row once ``exp(old - dsm)`` moved past ``1 +/- clip_range``.
        drift_threshold: above this mean squared surrogate-reference gap, freeze rows already better than the
            reference in their advantage's direction (``reg_threshold``).
        surrogate_min_sigma: lower bound of the re-noising level of the generator's surrogate term (``t_min_dgpo``).
        reward_min_sigma: lower bound of the surrogate's training re-noising level (``t_min_dgpo_reward``).
        time_shift: re-noising levels are uniform in unshifted time under this shift (SD3: 3).
        time_weighting: weight the surrogate loss by ``(b + 1) / K`` (``use_tweight``).
        micro_batch_size: rows per forward pass (None: this rank's batch at once).
        adapter_optimizer_options: per adapter (``default``, ``fake_score``, ``surrogate``) optimizer options over
            ``optimizer``'s, e.g. ``{default: {lr: 7.5e-5}}`` (the code: generator lr / 4).
        generator_init: LoRA weights the generator starts from (a folder or file from ``save_adapter`` or
            diffusers' ``save_lora_weights``, or an embedded ``flowrl/<name>``), e.g. a distilled few-step model.
    """

    named_adapters = (*ADAPTERS[1:], "surrogate_old")  # beside the generator, ``default``

    def __init__(self, policy: FlowPolicy, num_steps: int = 4, guidance_scale: float = 1.0, num_train_steps: int = 2,
                 trunc_steps: Optional[int] = None, teacher_guidance: float = 4.5, surrogate_guidance: float = 2.5,
                 tdm_weight: float = 0.3, beta: float = 1e-3, beta_dpo: float = 1.0, clip_range: float = 1e-3,
                 drift_threshold: float = 0.05, surrogate_min_sigma: float = 0.25, reward_min_sigma: float = 0.55,
                 time_shift: float = 3.0, time_weighting: bool = True, micro_batch_size: Optional[int] = None,
                 adapter_optimizer_options: Optional[dict[str, dict[str, Any]]] = None,
                 generator_init: Optional[str] = None, **kwargs: Any):
        super().__init__(policy, num_steps=num_steps, guidance_scale=guidance_scale, **kwargs)
        self.num_train_steps, self.teacher_guidance, self.surrogate_guidance = (num_train_steps, teacher_guidance,
                                                                                surrogate_guidance)
        self.tdm_weight, self.beta, self.beta_dpo, self.clip_range = tdm_weight, beta, beta_dpo, clip_range
        self.drift_threshold, self.surrogate_min_sigma = drift_threshold, surrogate_min_sigma
        self.reward_min_sigma, self.time_shift, self.time_weighting = reward_min_sigma, time_shift, time_weighting
        self.micro_batch_size = micro_batch_size
        self.trunc_steps, self.adapter_optimizer_options = trunc_steps, adapter_optimizer_options
        self.generator_init = generator_init

    def setup_weights(self) -> None:
        super().setup_weights()
        policy = self.policy
        fresh = dataclasses.replace(policy.lora, init=None)  # the others start as peft starts them
        for name in self.named_adapters:
            policy.add_adapter(name, fresh, trainable=name in ADAPTERS)
        if self.generator_init is not None:
            from flowrl.policies.adapter_weights import load_adapter

            load_adapter(policy, "default", self.generator_init)
        follow(policy, "surrogate_old", "surrogate", 0.0)  # a copy

    def problems(self) -> list[str]:
        problems = super().problems() + named_adapter_problems(self.policy, "TDM-R1")
        problems += guidance_distillation_problems(self.policy, self.teacher_guidance, self.surrogate_guidance)
        if self.guidance_scale != 1.0:
            problems.append(f"model.guidance_scale={self.guidance_scale}: TDM-R1's generator samples without CFG (its "
                            "CFG-as-reward term trains the guidance into it); use 1.0 and set model.teacher_guidance")
        T, trunc = self.num_steps, self.trunc_steps
        if not 1 <= self.num_train_steps <= T:
            problems.append(f"model.num_train_steps={self.num_train_steps} must be in [1, num_steps={T}] (the code: 2 "
                            "of 4)")
        if trunc is not None and trunc > T:
            problems.append(f"model.trunc_steps={trunc} exceeds the generator's num_steps={T}: every step already gets "
                            f"the surrogate term at {T}; use at most {T} (or null: all)")
        problems += at_least(self, 0, ("trunc_steps", "beta", "drift_threshold"))
        problems += at_least(self, 0, ("beta_dpo", "clip_range", "time_shift"), strict=True)
        problems += at_least(self, 1, ("teacher_guidance", "surrogate_guidance"), hint=" (1: no guidance)")
        problems += at_least(self, 1, ("micro_batch_size",), hint=" (or null: the whole batch at once)")
        if not 0 <= self.tdm_weight <= 1:
            problems.append(f"model.tdm_weight={self.tdm_weight} must be in [0, 1] (the code: 0.3)")
        for key in ("surrogate_min_sigma", "reward_min_sigma"):
            if not 0 <= getattr(self, key) < 1:
                problems.append(f"model.{key}={getattr(self, key)} must be in [0, 1): a noise level (the code's t_min / "
                                "1000)")
        if unknown := sorted(set(self.adapter_optimizer_options or {}) - set(ADAPTERS)):
            problems.append(f"model.adapter_optimizer_options has options for {unknown}: TDM-R1's trained adapters are "
                            f"{list(ADAPTERS)} (default is the generator)")
        init = self.generator_init
        if init is not None and not init.startswith("flowrl/") and not Path(init).exists():
            problems.append(f"model.generator_init={init!r} does not exist; give a folder with "
                            "pytorch_lora_weights.safetensors (or the file), or null to start from the backbone")
        return problems

    def build_optimizers(self):
        return adapter_optimizers(self.optimizer_factory, self.policy, list(ADAPTERS),
                                  self.adapter_optimizer_options or {})

    # -- model calls ---------------------------------------------------------------------------------------

    def v(self, adapter: Optional[str], z: Tensor, sigma: Tensor, cond: Conditioning, guidance: float = 1.0):
        """The velocity under adapter ``adapter`` (None: the reference, the backbone alone)."""
        if adapter is None:
            with self.policy.reference():
                return self.generation.velocity(z, sigma, cond, guidance)
        with self.policy.adapter(adapter):
            return self.generation.velocity(z, sigma, cond, guidance)

    def x0(self, adapter: Optional[str], z: Tensor, tau: Tensor, cond: Conditioning, guidance: float = 1.0):
        """The clean-sample prediction ``z - tau v`` at the level ``tau`` (a scalar) of every row."""
        return z - tau * self.v(adapter, z, tau.expand(len(z)), cond, guidance)

    def chunks(self, size: int) -> list[Tensor]:
        return list(torch.arange(size, device=self.device).split(self.micro_batch_size or size))

    def _noise(self, keys: Tensor, *path: int) -> Tensor:
        """Noise ``[B, *latent]``, row ``i`` from ``(keys[i], seed, step, *path)``: a row seed or a group id."""
        seeds = torch.tensor([branch_seed(int(k), [self.seed, self.global_step, *path]) for k in keys.tolist()])
        return seeded_noise(seeds, self.policy.latent_shape(), 1, self.device)[:, 0]

    # -- the step ------------------------------------------------------------------------------------------

    def plan(self, sigmas: Tensor) -> dict[str, Tensor]:
        """This step's shared draws: trained steps ``j [M]``, surrogate boundaries ``b [M]`` and re-noising levels
        (fake / generator-surrogate / surrogate-training) ``[M]``, from (seed, global step) alone."""
        gen = torch.Generator().manual_seed(branch_seed(self.seed, [self.global_step]))
        k, m = self.num_steps, self.num_train_steps
        steps = torch.randperm(k, generator=gen)[:m]
        bounds = torch.multinomial(torch.arange(1, k + 1, dtype=torch.float), m, replacement=True, generator=gen)
        u = torch.rand(3, m, generator=gen)
        s = sigmas.cpu().float()
        floor = lambda low: torch.maximum(s[steps + 1], torch.tensor(low))  # noqa: E731
        return {"steps": steps, "bounds": bounds, "fake_tau": renoise_sigma(s[steps + 1], u[0], self.time_shift),
                "gen_tau": renoise_sigma(floor(self.surrogate_min_sigma), u[1], self.time_shift),
                "reward_tau": renoise_sigma(torch.maximum(s[bounds + 1], torch.tensor(self.reward_min_sigma)), u[2],
                                            self.time_shift)}

    def update(self, rollout: Rollout, cond: Conditioning, batch: Batch) -> dict[str, float]:
        """The fake score's, the surrogate's and the generator's steps, in that order, on this batch; ``loss`` and
        ``grad_norm`` are the generator's (the policy's own adapter), the others' under their names."""
        plan = self.plan(rollout.sigmas[0])
        opt_generator, opt_fake, opt_surrogate = self.optimizers()
        metrics = self.fake_score_update(rollout, cond, plan, opt_fake)
        metrics.update(self.surrogate_update(rollout, cond, batch, plan, opt_surrogate))
        metrics.update(self.generator_update(rollout, cond, plan, opt_generator))
        # a skipped (non-finite) step has no norm (the loop counts it in train/nonfinite_steps)
        return {key: float("nan") if value is None else value for key, value in metrics.items()}

    def fake_score_update(self, r: Rollout, cond: Conditioning, plan, opt) -> dict[str, float]:
        size, m, total, sigmas, steps = r.batch_size, len(plan["steps"]), 0.0, r.sigmas[0], self.training_steps()
        for i, j in enumerate(plan["steps"].tolist()):
            sigma, tau = sigmas[j], plan["fake_tau"][i].to(self.device)
            for rows in self.chunks(size):
                c, z, n = cond.select(rows), r.latents[rows, j], len(rows)
                with torch.no_grad():
                    v = self.v("default", z, sigma.expand(n), c)
                    x0, z_next = z - sigma * v, z - (sigma - sigmas[j + 1]) * v
                    z_tau, _, _ = renoise(z_next, sigmas[j + 1].expand(n), tau.expand(n),
                                          self._noise(r.seeds[rows], 0, i))
                    real = self.v(None, z_tau, tau.expand(n), c)
                loss = fake_score_loss(self.v("fake_score", z_tau, tau.expand(n), c), (z_tau - x0) / tau, real)
                backward(steps, loss.sum() / (size * m))
                total += float(loss.detach().sum())
        norm = adapter_step(steps, opt, self.policy.trainable_parameters("fake_score"), bool(torch.isfinite(
            torch.tensor(total))), counted=False)
        return {"loss/fake_score": total / (size * m), "grad_norm/fake_score": norm}

    def surrogate_update(self, r: Rollout, cond: Conditioning, batch: Batch, plan, opt) -> dict[str, float]:
        size, m, total, frozen_frac, weight_mean = r.batch_size, len(plan["steps"]), 0.0, 0.0, 0.0
        steps, all_advantages = self.training_steps(), batch.advantages[:, -1]  # [B_all] the outcome's, every rank
        advantages = all_advantages[batch.rows]
        for i, b in enumerate(plan["bounds"].tolist()):
            sigma_b, tau = r.sigmas[0, b + 1].expand(size), plan["reward_tau"][i].to(self.device).expand(size)
            noise = self._noise(r.group_ids, 1, i)  # one noise per group
            z_tau, _, _ = renoise(r.latents[:, b + 1], sigma_b, tau, noise)
            target = surrogate_target(r.latents[:, b + 1], sigma_b, tau, noise)
            with torch.no_grad():  # per-row losses of every rank first: the group logits need them all
                stats = torch.cat([self._denoising(z_tau[rows], tau[rows], cond.select(rows), target[rows])
                                   for rows in self.chunks(size)])  # [B, 4]: dsm, old, ref, drift
            everyone = self.ranks.gather(stats, batch.sizes)
            logits = group_logits(everyone[:, 0] - everyone[:, 2], all_advantages, batch.group_ids, self.beta_dpo)
            weights = torch.sigmoid(logits)[batch.rows]
            frozen = frozen_rows(stats[:, 0], stats[:, 1], stats[:, 2], advantages, self.clip_range,
                                 everyone[:, 3].mean(), self.drift_threshold)
            t_weight = (b + 1) / self.num_steps if self.time_weighting else 1.0
            for rows in self.chunks(size):
                c = cond.select(rows)
                v_sur = self.v("surrogate", z_tau[rows], tau[rows], c)
                with torch.no_grad():
                    v_ref = self.v(None, z_tau[rows], tau[rows], c)
                dsm = (target[rows] - v_sur).square().flatten(1).mean(1)
                loss = (group_preference_loss(dsm, advantages[rows], weights[rows], frozen[rows])
                        + self.beta * (v_sur - v_ref).square().flatten(1).mean(1).mean()) * len(rows) / size
                backward(steps, loss * t_weight / m)
                total += float(loss.detach()) * t_weight / m
            frozen_frac += float(frozen.float().mean()) / m
            weight_mean += float(weights.mean()) / m
        norm = adapter_step(steps, opt, self.policy.trainable_parameters("surrogate"),
                            bool(torch.isfinite(torch.tensor(total))), counted=False)
        decay = min(OLD_DECAY[2], OLD_DECAY[0] + OLD_DECAY[1] * self.global_step)  # the code's ema_old decay
        follow(self.policy, "surrogate_old", "surrogate", decay)
        return {"loss/surrogate": total, "grad_norm/surrogate": norm,
                "surrogate/frozen_frac": frozen_frac, "surrogate/weight_mean": weight_mean}

    def _denoising(self, z: Tensor, tau: Tensor, c: Conditioning, target: Tensor) -> Tensor:
        """``[n, 4]``: the surrogate's, its old copy's and the reference's denoising losses, and the surrogate's
        squared gap to the reference."""
        v_sur, v_old, v_ref = (self.v(a, z, tau, c) for a in ("surrogate", "surrogate_old", None))
        mse = lambda a, b: (a - b).square().flatten(1).mean(1)  # noqa: E731
        return torch.stack([mse(target, v_sur), mse(target, v_old), mse(target, v_ref), mse(v_sur, v_ref)], 1)

    def generator_update(self, r: Rollout, cond: Conditioning, plan, opt) -> dict[str, float]:
        size, m, total, steps = r.batch_size, len(plan["steps"]), 0.0, self.training_steps()
        for i, j in enumerate(plan["steps"].tolist()):
            sigma, sigma_next = r.sigmas[0, j], r.sigmas[0, j + 1]
            tau, tau_s = plan["fake_tau"][i].to(self.device), plan["gen_tau"][i].to(self.device)
            for rows in self.chunks(size):
                c, z, n = cond.select(rows), r.latents[rows, j], len(rows)
                v = self.v("default", z, sigma.expand(n), c)
                x0, z_next = z - sigma * v, (z - (sigma - sigma_next) * v).detach()
                with torch.no_grad():
                    z_tau, _, _ = renoise(z_next, sigma_next.expand(n), tau.expand(n),
                                          self._noise(r.seeds[rows], 2, i))
                    real = self.x0(None, z_tau, tau, c)
                    # at teacher_guidance 1 the CFG term is the conditional velocity's: no unconditional evaluation
                    # (a step-distilled model has none)
                    uncond = real if self.teacher_guidance == 1.0 else self.x0(None, z_tau, tau, c.unconditional())
                    targets = {"real_cond": real, "fake": self.x0("fake_score", z_tau, tau, c), "real_uncond": uncond}
                    # the surrogate's direction (trunc_steps null: every step), from noise shared by the group
                    if self.trunc_steps is None or j < self.trunc_steps:
                        z_s, _, _ = renoise(z_next, sigma_next.expand(n), tau_s.expand(n),
                                            self._noise(r.group_ids[rows], 3, i))
                        targets.update(surrogate=self.x0("surrogate", z_s, tau_s, c, self.surrogate_guidance),
                                       surrogate_ref=self.x0(None, z_s, tau_s, c))
                loss, _ = generator_loss(x0, teacher_guidance=self.teacher_guidance, tdm_weight=self.tdm_weight,
                                         **targets)
                backward(steps, loss.float().sum() / (size * m))
                total += float(loss.detach().sum())
        norm = adapter_step(steps, opt, self.policy.trainable_parameters("default"),
                            bool(torch.isfinite(torch.tensor(total))))
        return {"loss": total / (size * m), "grad_norm": norm}
