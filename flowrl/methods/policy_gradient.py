"""Policy gradient on denoising trajectories: the SDE rollouts and the PPO update every GRPO-family method shares.

The loop is the base module's (:class:`~flowrl.methods.base.BaseModule`); this layer samples with a stochastic step
kind, credits the stochastic steps, and updates with :class:`~flowrl.training.ppo_update.PPOUpdate` over the trained
(row, step) pairs of the batch gathered from every rank. A method overrides the hooks it needs, never the loop:

- ``sde_mask`` / ``trained_steps`` / ``noise_levels``: which steps are stochastic, trained, and how noisy;
- ``rollout``: how a batch is sampled (plain trajectories by default; branches and trees fill ``node_ids``);
- ``completion_starts``: which states are completed with the ODE and scored (dense step-reward methods);
- ``step_rewards``, ``advantages``, ``loss_weights``, ``supervised_weights``: on the gathered batch, returning tensors.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl import losses
from flowrl.methods.base import BaseModule
from flowrl.methods.batch import Batch
from flowrl.methods.downsample import downsample_problems, downsampled
from flowrl.methods.option_surface import at_least
from flowrl.policies.base import CFG_GRADIENTS, Conditioning, FlowPolicy
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import trained_steps
from flowrl.sampling.steps import MAX_NOISE_LEVEL, ODE_STEPS, PREDICTIONS, STEPS, StepOutput, get_step
from flowrl.training.ppo_update import PPOUpdate, UpdateBatch


class PolicyGradient(BaseModule):
    """The shared loop with PPO. Options beyond the base's (:class:`~flowrl.methods.base.BaseModule`):

    Args:
        step_kind: the SDE step (``flow_grpo``, ``cps``, ``dance``; ``ddim`` for SD1.5).
        noise_level: the SDE's noise scale ``a``.
        clip_range: PPO ratio clip ``epsilon`` (the loss's ``clip_low``).
        loss: policy loss or preset of ``flowrl.losses`` (``vanilla``, ``gspo``, ``gpg``, ``cispo``, ``sapo``;
            ``dppo``: Flow-DPPO's trust-region mask, ``grpo_guard``: GRPO-Guard's RatioNorm, both reading the
            old means from a replay before the update).
        loss_options: the loss's options, e.g. ``{clip_high: 2.0e-4, dual_clip: 3.0}``. A sequence-level loss
            (``gspo``) trains every trained step of a sample in one micro-batch.
        beta: KL coefficient to the reference policy (0 disables), in ``kl_convention``'s units.
        kl_convention: ``exact`` (the Gaussian KL of the two transitions) or ``flow_grpo`` (flow_grpo's
            ``train_sd3.py``: divided by the SDE's ``s^2`` rather than the step's variance ``s^2 |dt|``, i.e. the exact
            KL times ``|dt|``), so that a published ``beta`` means what it meant in its authors' code.
        cfg_gradient: which halves of classifier-free guidance carry the policy gradient: ``both`` (the exact
            gradient of the guided velocity) or ``cond`` (the unconditional half detached, as flow_grpo: it then runs
            without a graph, so the training pass does no backward through it).
        num_inner_epochs: PPO epochs over one rollout batch.
        num_minibatches: optimizer steps per epoch (``trainer.max_steps`` counts them).
        micro_batch_size: (sample, step) pairs per forward/backward.
        check_ratio: before the first update, recompute every trained step's log-prob with the unchanged weights in
            the update's micro-batches and log ``train/check_ratio_max_dev`` = max |ratio - 1| (0 on-policy).
        check_ratio_threshold: warn (rank zero) above this deviation (fp32 on CPU stays below 1e-5; bf16 on an H100:
            1.2e-7 for the flow models, 1.6e-3 for SD1.5's DDIM).
        recompute_log_probs: before the update, replace the sampled log-probs of the trained steps by their values
            under the unchanged weights in the update's own micro-batches (verl's ``old_log_prob``), so the first
            minibatch's ratios are exactly 1 whatever the sampling batch or precision; one extra forward pass.
        downsample_to: PODS (arXiv 2504.13818): train only ``m`` rows of each prompt's group, those whose rewards have
            the largest variance, with the advantages computed on them alone (:mod:`flowrl.methods.downsample`);
            the other rows are sampled and scored but run no training pass. ``2 <= m < data.group_size``; None: every
            row. Only where the advantage is one per row (an outcome estimator).
    """

    uses_ppo = True  # one optimizer, stepped through the strategy: what DeepSpeed's engine runs (strategies.checks)
    step_credit: Optional[str] = None  # what a method credits beyond one advantage per row (refuses downsample_to)

    def __init__(self, policy: FlowPolicy, step_kind: str = "flow_grpo", noise_level: float = 0.7,
                 clip_range: float = 1e-4, loss: str = "vanilla", loss_options: Optional[dict[str, Any]] = None,
                 beta: float = 0.0, kl_convention: str = "exact", cfg_gradient: str = "both",
                 num_inner_epochs: int = 1, num_minibatches: int = 1, micro_batch_size: int = 16,
                 check_ratio: bool = False, check_ratio_threshold: float = 1e-3, recompute_log_probs: bool = False,
                 downsample_to: Optional[int] = None, **kwargs: Any):
        # **kwargs passed on unchanged: jsonargparse reads the base's signature through it (--help, YAML checks)
        super().__init__(policy, **kwargs)
        self.step_kind, self.noise_level = step_kind, noise_level
        self.kl_convention, self.cfg_gradient = kl_convention, cfg_gradient
        self.clip_range, self.loss, self.loss_options, self.beta = clip_range, loss, loss_options, beta
        self.num_inner_epochs, self.num_minibatches = num_inner_epochs, num_minibatches
        self.micro_batch_size, self.check_ratio = micro_batch_size, check_ratio
        self.check_ratio_threshold, self.recompute_log_probs = check_ratio_threshold, recompute_log_probs
        self.downsample_to = downsample_to

    @cached_property
    def ppo(self) -> PPOUpdate:
        """The PPO update of these options (built on first use: the loss resolves only once the options are
        checked)."""
        loss, options = losses.resolve_policy_loss(self.loss, **clip_options(self.loss, self.clip_range),
                                                   **(self.loss_options or {}))
        return PPOUpdate(loss=loss, loss_options=options, beta=self.beta, num_inner_epochs=self.num_inner_epochs,
                         num_minibatches=self.num_minibatches, micro_batch_size=self.micro_batch_size,
                         check_ratio=self.check_ratio, check_ratio_threshold=self.check_ratio_threshold,
                         recompute_log_probs=self.recompute_log_probs)

    @classmethod
    def inapplicable_options(cls) -> tuple[str, ...]:
        """Options this class inherits but refuses whatever their value (a method switch leaves them out of the config
        it carries over: :mod:`flowrl.cli.method_switch`): ``downsample_to`` where the credit is per step or node."""
        return ("downsample_to",) if cls.step_credit is not None else ()

    def setup_weights(self) -> None:
        super().setup_weights()
        if self.beta > 0:  # the KL's reference: full fine-tuning copies the loaded weights
            self.policy.setup_reference()

    def problems(self) -> list[str]:
        problems = super().problems() + step_kind_problems(self.step_kind, self.policy)
        level, kind = self.noise_level, self.step_kind
        if not level > 0:  # also NaN
            problems.append(f"model.noise_level={level} must be > 0: the SDE step's std is proportional to it, and 0 "
                            "or less gives NaN log-probs (use the ODE for deterministic sampling; 0.7 is Flow-GRPO's)")
        if level > MAX_NOISE_LEVEL.get(kind, float("inf")):
            problems.append(f"model.noise_level={level} exceeds {MAX_NOISE_LEVEL[kind]:g}, the largest the {kind} step "
                            "is defined for (DDIM's eta); lower it")
        problems += at_least(self, 0, ("beta",), hint=" (the KL penalty's coefficient; 0 disables it)")
        if self.kl_convention not in losses.KL_CONVENTIONS:
            problems.append(f"model.kl_convention={self.kl_convention!r}: choose one of {list(losses.KL_CONVENTIONS)} "
                            "(the units beta is stated in)")
        if self.cfg_gradient not in CFG_GRADIENTS:
            problems.append(f"model.cfg_gradient={self.cfg_gradient!r}: choose one of {list(CFG_GRADIENTS)}")
        problems += at_least(self, 1, ("num_inner_epochs", "num_minibatches", "micro_batch_size"))
        problems += downsample_problems(self)
        if self.loss not in losses.available_policy_losses():
            return problems + [f"model.loss={self.loss!r}: choose a policy loss from "
                               f"{losses.available_policy_losses()}"]
        try:
            losses.resolve_policy_loss(self.loss, **clip_options(self.loss, self.clip_range),
                                       **(self.loss_options or {}))
        except ValueError as err:
            problems.append(f"model.loss_options: {err}")
        return problems

    # -- hooks ---------------------------------------------------------------------------------------------

    def noise_levels(self) -> Tensor:
        """Per-step noise scale ``[T]`` (DenseGRPO calibrates it)."""
        return torch.full((self.num_steps,), float(self.noise_level))

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        """Which steps the loss trains ``[T]`` (default: every stochastic step with a non-zero std)."""
        return trained_steps(sde_mask, 1.0, sigmas, self.step_kind)

    def batches_done(self) -> int:
        """Rollout batches trained so far (each takes ``num_inner_epochs * num_minibatches`` optimizer steps): the
        iteration a schedule over training reads, the same after a resume."""
        return self.global_step // (self.num_inner_epochs * self.num_minibatches)

    def apply_hooks(self, batch: Batch) -> Batch:
        """The loop's credit; with ``downsample_to``, on each group's max-variance rows alone (PODS)."""
        if self.downsample_to is None:
            return super().apply_hooks(batch)
        return downsampled(batch, self.downsample_to, self.advantage_groups, super().apply_hooks)

    # -- the update ----------------------------------------------------------------------------------------

    def transition(self, rollout: Rollout, cond: Conditioning, pairs: Tensor) -> StepOutput:
        """The sampler step of ``pairs [P, 2]`` (row, step) from its recorded latents, with the policy's velocity
        (the reference's inside ``policy.reference()``): its mean, std and the log-prob of the recorded next latent."""
        b, k = pairs[:, 0], pairs[:, 1]
        z, sigma = rollout.states(b, k), rollout.sigmas[b, k]
        velocity = self.generation.velocity(z, sigma, cond.select(rollout.cond_rows[b]), self.guidance_scale,
                                            self.cfg_gradient)
        return get_step(self.step_kind)(z, velocity, sigma, rollout.sigmas[b, k + 1], z_next=rollout.states(b, k + 1),
                                        noise_level=self.noise_levels().to(self.device)[k])

    def kl_scale(self, rollout: Rollout) -> Tensor:
        """``[B, T]`` each step's factor from the exact KL to ``kl_convention``'s (:func:`flowrl.losses.kl_convention_
        scale`)."""
        return losses.kl_convention_scale(self.kl_convention, self.step_kind, rollout.sigmas[:, :-1],
                                          rollout.sigmas[:, 1:])

    def reference_transition(self, rollout: Rollout, cond: Conditioning, pairs: Tensor) -> StepOutput:
        """:meth:`transition` under the reference policy (the KL's other side)."""
        with self.policy.reference():
            return self.transition(rollout, cond, pairs)

    def pair_loss(self, rollout: Rollout, cond: Conditioning, advantages: Tensor, weights: Tensor, pairs: Tensor,
                  supervised: Optional[Tensor] = None) -> tuple[Tensor, dict[str, float]]:
        """The update's loss of ``pairs [P, 2]`` of one process's ``rollout`` (advantages, weights ``[B, T]``) and its
        diagnostics: the training pass the update runs per micro-batch (benchmarks and tests time and check it)."""
        batch = UpdateBatch(rollout, advantages, weights, rollout.train_mask, slice(0, rollout.batch_size), supervised,
                            self.kl_scale(rollout))
        return self.ppo.pair_loss(batch, lambda p: self.transition(rollout, cond, p),
                                  lambda p: self.reference_transition(rollout, cond, p), pairs)

    def update(self, rollout: Rollout, cond: Conditioning, batch: Batch) -> dict[str, float]:
        """The PPO update of this rank's trained pairs, minibatches drawn over every rank's."""
        self.policy.train()
        to_train = UpdateBatch(rollout=rollout, advantages=batch.mine(batch.advantages),
                               weights=batch.mine(batch.loss_weights), global_mask=batch.trained, rows=batch.rows,
                               supervised=batch.mine(batch.supervised_weights), kl_scale=self.kl_scale(rollout))
        return self.ppo.run(to_train, lambda pairs: self.transition(rollout, cond, pairs),
                            lambda pairs: self.reference_transition(rollout, cond, pairs), self.training_steps(),
                            self.optimizers(), seed=self.seed * 1_000_003 + self.global_step,
                            check_ratio=self.check_ratio and self.global_step == 0)


def clip_options(loss: str, clip_range: float) -> dict[str, Any]:
    """``clip_range`` as the policy loss's ``clip_low``, where the loss (or the preset's loss) has one.

    >>> clip_options("vanilla", 1e-4), clip_options("gpg", 0.2)
    ({'clip_low': 0.0001}, {})
    """
    try:
        base, _ = losses.resolve_policy_loss(loss)
    except ValueError:  # an unknown loss: the check names it
        return {}
    return {"clip_low": clip_range} if "clip_low" in losses.policy_loss_options(base) else {}


def step_kind_problems(step_kind: str, policy: Any) -> list[str]:
    """``step_kind`` must be an SDE step that reads the model output as the policy predicts it (a velocity for flow
    models, a noise prediction for SD1.5) by the built ``policy`` (None: not known)."""
    sde_kinds = sorted(set(STEPS) - set(ODE_STEPS.values()))
    if step_kind not in sde_kinds:
        return [f"model.step_kind={step_kind!r}: choose an SDE step from {sde_kinds}"]
    if (predicts := getattr(policy, "prediction", None)) and PREDICTIONS[step_kind] != predicts:
        fitting = [k for k in sde_kinds if PREDICTIONS[k] == predicts]
        return [f"model.step_kind={step_kind!r} reads the model output as a {PREDICTIONS[step_kind]}, but the policy "
                f"predicts {predicts}; choose a step kind from {fitting}"]
    return []
