"""The base of every method: the one training loop, its hooks, and the options every method has.

One training step, for every method (:meth:`BaseModule.training_step`):

    batch --encode--> cond --rollout (sampled and scored sample_chunk_size rows at a time)--> Rollout (this rank's)
      --gather--> Batch (every rank's per-row fields) --aggregate--> total, valid
      --hooks on the Batch: step_rewards, advantages, loss_weights, supervised_weights--> credit (same on every rank)
      --update (the method's own)--> metrics --log--> the same core metrics for every method

Policy-gradient methods (:class:`~flowrl.methods.policy_gradient.PolicyGradient`) update with PPO; TDM-R1 and
DiffusionNFT override :meth:`~BaseModule.update` on named adapters and keep the rest. A hook takes the gathered
:class:`~flowrl.methods.batch.Batch` and returns a tensor, or a tensor and diagnostics to log; hooks never
communicate and never change state behind the loop. Every option is an attribute, set once in ``__init__``; each
class states its rules in ``problems()`` (:mod:`flowrl.methods.option_surface`), and they are checked together when
the most derived ``__init__`` returns (:class:`CheckedOnBuild`), before any weight loads (``configure_model``), so a
bad value fails naming its key however the method is built.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from flowrl import advantages as adv_lib
from flowrl.checkpoints.atomic import use_atomic_saves
from flowrl.checkpoints.fit import load_mismatch, method_path
from flowrl.methods import default_hooks
from flowrl.methods.batch import GATHERED, Batch, hook_value
from flowrl.methods.checked_on_build import CheckedOnBuild
from flowrl.methods.distributed import CheckedStep, Ranks
from flowrl.methods.distributed import training_steps as strategy_steps
from flowrl.methods.generation import Generation
from flowrl.methods.option_surface import (MethodOptionsError, at_least, guidance_gate_problems,
                                           guidance_scale_problems, optimizer_problems, policy_guidance_scales)
from flowrl.methods.step_metrics import StepMetrics
from flowrl.methods.trained_pairs import UntrainedBatches, trained_pairs, untrained_problems
from flowrl.methods.trajectories import Trajectories
from flowrl.output_dirs import output_dir_problems
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.rewards.aggregate import AGGREGATIONS
from flowrl.sampling.completions import Completions
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.steps import ODE_STEPS
from flowrl.strategies.fsdp2 import load_for_strategy
from flowrl.training.lr_schedules import step_schedulers, with_schedulers
from flowrl.training.nonfinite import NonfiniteSteps
from flowrl.training.steps import TrainingSteps


class BaseModule(Trajectories, metaclass=CheckedOnBuild):
    """Options every method has (all appear in ``python -m flowrl fit --help``).

    Args:
        policy: the policy adapter (``flowrl.policies.*``).
        num_steps: sampling steps ``T`` of a training rollout.
        eval_num_steps: ODE steps of validation samples (None: ``num_steps``).
        guidance_scale: classifier-free guidance at sampling and training (1 disables it).
        advantage: estimator or preset of ``flowrl.advantages`` (e.g. ``grpo@flow_grpo``: group mean, population
            std of the gathered batch, +1e-4, clip 5).
        advantage_options: overrides of the estimator's options.
        reward_aggregation: how the rewards combine (``flowrl.rewards.aggregate``): ``sum`` (weighted raw sum),
            ``advantage_sum`` (each normalised within its group, then weighted) or ``gdpo`` (then batch-normalised).
        sample_chunk_size: sample the batch in chunks of this many rows, submitting each chunk's images for scoring
            as soon as they exist (a ``RemoteReward`` with ``overlap`` scores them while the next chunk samples);
            results do not depend on it. None: one chunk.
        optimizer: e.g. ``{class_path: torch.optim.AdamW, init_args: {lr: 3e-4}}``.
        lr_scheduler: a torch scheduler of each optimizer, stepped once per training batch (a batch's minibatch
            steps share its rate), e.g. ``{class_path: torch.optim.lr_scheduler.CosineAnnealingLR, init_args:
            {T_max: 260}}`` to decay to 0 over 260 batches. None: a constant rate.
        max_grad_norm: clip the gradient norm to this before each optimizer step (None disables).
        max_nonfinite_steps: an optimizer step whose loss or gradient norm is NaN or inf (on any rank) is skipped
            and counted (``train/nonfinite_steps``); this many skipped in a row stop the run with an error naming
            the quantity.
        max_untrained_batches: a batch with no (sample, step) pair left to train (every advantage non-finite, every
            trained step weighted 0) takes no optimizer step and is counted (``train/untrained_batches``); this many
            in a row stop the run with an error.
        seed: seeds the method's own randomness (the shuffling of training pairs, calibration noise).
    """

    min_group_size = 2  # samples per prompt a method needs (1: a method that groups one tree per prompt)
    raw_rewards = False  # a method that differences rewards along a trajectory needs reward_aggregation: sum
    named_adapters: tuple[str, ...] = ()  # LoRA adapters the method adds beside the policy's own (``default``)

    def __init__(self, policy: FlowPolicy, num_steps: int = 10, eval_num_steps: Optional[int] = None,
                 guidance_scale: float = 4.5, advantage: str = "grpo@flow_grpo",
                 advantage_options: Optional[dict[str, Any]] = None, reward_aggregation: str = "sum",
                 sample_chunk_size: Optional[int] = None, optimizer: OptimizerCallable = torch.optim.AdamW,
                 lr_scheduler: Optional[LRSchedulerCallable] = None,
                 max_grad_norm: Optional[float] = 1.0, max_nonfinite_steps: int = 3, max_untrained_batches: int = 3,
                 seed: int = 0):
        super().__init__()
        self.automatic_optimization = False
        self.policy = policy
        self.num_steps, self.eval_num_steps = num_steps, eval_num_steps
        self.guidance_scale, self.optimizer_factory, self.lr_scheduler = guidance_scale, optimizer, lr_scheduler
        self.advantage, self.advantage_options = advantage, advantage_options
        self.reward_aggregation, self.sample_chunk_size = reward_aggregation, sample_chunk_size
        self.max_grad_norm, self.seed = max_grad_norm, seed
        self.max_nonfinite_steps, self.max_untrained_batches = max_nonfinite_steps, max_untrained_batches
        self.nonfinite = NonfiniteSteps(max_nonfinite_steps)  # checkpointed
        self.untrained = UntrainedBatches(max_untrained_batches)  # checkpointed
        # training rollouts: the ODE unless a method samples an SDE (a policy of None: a check of options alone)
        self.step_kind = ODE_STEPS[getattr(policy, "prediction", "velocity")]
        self.completions: Optional[Completions] = None  # dense step-reward methods set one
        self.unlogged_evaluations = 0.0  # evaluations spent outside rollouts (calibration), counted at the next log
        self.weights_loaded = False  # configure_model loads them (load_weights)
        # what the module owns rather than inherits: conditioning, the counted velocity, deterministic samples
        self.generation = Generation(policy, guidance_scale, eval_num_steps or num_steps, placement=self)

    def problems(self) -> list[str]:
        """Every problem of this class's options, each naming its key and fix; a subclass adds its own to
        ``super().problems()`` (base first). Reads the attributes and the built policy's configs, no weight."""
        problems = at_least(self, 1, ("num_steps", "eval_num_steps", "max_nonfinite_steps", "max_untrained_batches",
                                      "sample_chunk_size"))
        problems += at_least(self, 0, ("max_grad_norm",), strict=True, hint=" (or null: no clipping)")
        try:
            adv_lib.resolve(self.advantage, **(self.advantage_options or {}))
        except ValueError as err:
            problems.append(f"model.advantage: {err}")
        name, aggregation = type(self).__name__, self.reward_aggregation
        if aggregation not in AGGREGATIONS:
            problems.append(f"model.reward_aggregation={aggregation!r}: choose one of {sorted(AGGREGATIONS)}")
        elif self.raw_rewards and aggregation != "sum":
            problems.append(f"model.reward_aggregation={aggregation!r}: {name} takes differences of raw weighted "
                            "rewards along a trajectory; use reward_aggregation: sum")
        problems += guidance_scale_problems(self.policy, self.guidance_scale)
        for key, scale in policy_guidance_scales(self.policy).items():  # Wan 2.2's second expert's
            problems += guidance_scale_problems(self.policy, scale, key)
            problems += guidance_gate_problems(self.guidance_scale, key, scale)
        return problems + optimizer_problems(self.optimizer_factory)

    def all_problems(self) -> list[str]:
        """:meth:`problems`, then (when there are none) the rule every method shares, that a batch trains some
        (sample, step) pair (:func:`~flowrl.methods.trained_pairs.untrained_problems`)."""
        return self.problems() or untrained_problems(self)

    def check(self) -> None:
        """Raise :meth:`all_problems` together (:class:`~flowrl.methods.option_surface.MethodOptionsError`), if any.
        Runs when the method is built (:class:`CheckedOnBuild`)."""
        if problems := self.all_problems():
            raise MethodOptionsError(problems)

    def rollout_cost(self) -> tuple[int, int]:
        """``(samples, model evaluations)`` of one rollout (one seed): a trajectory of ``T`` steps by default; a
        tree's leaves, completions included (a CFG pair counted once). The data layout (how many seeds make
        ``data.group_size`` samples), the checks before loading and the run header read it."""
        return 1, self.num_steps

    def configure_optimizers(self):
        return with_schedulers(self.build_optimizers(), self.lr_scheduler)

    def build_optimizers(self) -> torch.optim.Optimizer | list[torch.optim.Optimizer]:
        """The method's optimizers (one over every trained parameter; a method of several adapters, one each)."""
        return self.optimizer_factory(self.policy.trainable_parameters())

    def configure_model(self) -> None:
        # Lightning calls this under every strategy, before the optimizers exist: the weights load here, not when the
        # objects are built, so that every check before it ran on configs alone; only FSDP2 changes the model here
        load_for_strategy(self.trainer.strategy, self)  # under fsdp2 each process loads only its shards
        use_atomic_saves(self.trainer.strategy)  # a failed save keeps the previous checkpoint; `last` the newest

    def load_weights(self) -> "BaseModule":
        """Load the policy's weights, then run :meth:`setup_weights`; once (a later call does nothing). Returns the
        module."""
        if not self.weights_loaded:
            self.policy.load()
            with self.policy.initialising():  # a method's adapters draw after the policy's LoRA, as when built with it
                self.setup_weights()
            self.weights_loaded = True
        return self

    def setup_weights(self) -> None:
        """What the method needs from the loaded policy (the frozen reference, extra named adapters); runs once,
        right after the policy's weights load."""

    # -- what the module owns: collectives, the strategy's side of an update, the step metrics -----------------

    @property
    def ranks(self) -> Ranks:
        """Collectives over the ranks of the running trainer."""
        return Ranks(self.trainer, self.all_gather, self.device)

    def training_steps(self) -> TrainingSteps:
        """Backward passes, gradient syncs, checked optimizer steps and collectives through this trainer's strategy,
        as the callables the update components take."""
        checked = CheckedStep(self.trainer, self.nonfinite, self.clip_gradients, self.max_grad_norm,
                              self.policy.trainable_parameters)
        return strategy_steps(self.trainer, self.manual_backward, checked.step, self.policy.trainable_parameters)

    def log_step(self, rollout: Rollout, batch: Batch, metrics: dict[str, float], sampling_s: float,
                 guided: bool) -> None:
        """The metrics every method logs (:class:`~flowrl.methods.step_metrics.StepMetrics`), the evaluations spent
        outside rollouts since the last batch among them."""
        ranks = self.ranks
        StepMetrics(self.log, self.reward_set, ranks.global_metrics, ranks.once).log_step(
            rollout, batch, metrics, sampling_s, guided and self.guidance_scale != 1.0, self.unlogged_evaluations)
        self.unlogged_evaluations = 0.0

    def on_fit_start(self) -> None:
        if not len(self.reward_set):
            raise RuntimeError("no reward callback on the trainer: add one under trainer.callbacks, e.g. "
                               "{class_path: flowrl.rewards.DigitAlignment}")
        problems = output_dir_problems(self.trainer, self.trainer.is_global_zero)
        elsewhere = self.trainer.world_size > 1 and self.trainer.strategy.reduce_boolean_decision(
            bool(problems), all=False)  # every rank stops, or none: a rank left alone would wait in a collective
        if problems or elsewhere:
            raise PermissionError("output folders cannot be written (checked before the first rollout):\n  " +
                                  "\n  ".join(problems or ["on another rank; see its error"]))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["flowrl_loop"] = {**self.nonfinite.state_dict(), **self.untrained.state_dict()}
        checkpoint["flowrl_method"] = method_path(type(self))  # read before loading (checkpoints.fit)
        checkpoint["flowrl_policy"] = method_path(type(self.policy))  # its family, read before loading too

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # before Lightning loads the weights (FSDP2 loads them earlier, in its strategy): one line, not torch's list of
        # every missing and unexpected key, for a checkpoint of another method or policy
        saved = {k: tuple(v.shape) for k, v in checkpoint.get("state_dict", {}).items()}
        if "state_dict" in checkpoint and self.strict_loading and (why := load_mismatch(
                saved, {k: tuple(v.shape) for k, v in self.state_dict().items()}, checkpoint.get("flowrl_method"),
                method_path(type(self)))):
            raise RuntimeError(f"{why}; load it with the config of the run that wrote it (the config.yaml beside it)")
        self.nonfinite.load_state_dict(checkpoint.get("flowrl_loop", {}))
        self.untrained.load_state_dict(checkpoint.get("flowrl_loop", {}))

    # -- the loop ------------------------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        """One batch, for every method: rollout and rewards, the gathered batch and its credit (the hooks), the
        method's :meth:`update`, the core metrics. Returns this rank's images, prompts, rewards, seeds, group ids,
        advantages, scores and node ids (sample grids and dumps read them)."""
        started = time.perf_counter()
        self.policy.eval()  # no dropout: sampling and training must see the same network
        with torch.no_grad():
            cond = self.generation.encode(batch)
            rollout = self.rollout_and_score(batch, cond)
        sampling_s = time.perf_counter() - started
        credited = self.credit(self.gathered(rollout))
        rollout.step_rewards, rollout.train_mask = credited.mine(credited.step_rewards), credited.mine(credited.trained)
        pairs, why = trained_pairs(credited.trained, credited.valid, credited.loss_weights, credited.advantages)
        skip = self.untrained.skip(pairs, self.global_step, why)  # the gathered batch: one decision on every rank
        passes, skipped = self.generation.forward_passes, self.nonfinite.skipped
        metrics = {} if skip else self.update(rollout, cond, credited)
        # counted here for every method alike: the update's model evaluations per sample of this rank (a CFG pair 2;
        # every model call goes through Generation.velocity) and its optimizer steps skipped as non-finite
        metrics["forward_passes"] = (self.generation.forward_passes - passes) / rollout.batch_size
        metrics["nonfinite_steps"] = float(self.nonfinite.skipped - skipped)
        metrics["untrained_batches"] = float(self.untrained.in_a_row)
        self.log_step(rollout, credited, {**credited.diagnostics, **metrics}, sampling_s, cond.guided)
        step_schedulers(self.lr_schedulers())  # here, not in on_train_batch_end: a checkpoint saved there holds it
        mine = credited.rows
        return {"images": rollout.images, "prompts": rollout.prompts, "rewards": credited.total[mine],
                "seeds": rollout.seeds, "group_ids": rollout.group_ids, "advantages": credited.advantages[mine],
                "scores": rollout.rewards, "node_ids": rollout.node_ids}

    def gathered(self, rollout: Rollout) -> Batch:
        """The rollout's per-row fields (no latents, images or prompts) from every rank, in rank order."""
        ranks = self.ranks
        sizes = ranks.rank_sizes(rollout.batch_size)
        fields = {name: ranks.gather(getattr(rollout, name), sizes) if getattr(rollout, name) is not None else None
                  for name in GATHERED}  # cond_rows index each rank's own prompts: not gathered
        rewards = {name: ranks.gather(scores, sizes) for name, scores in rollout.rewards.items()}
        return Batch(prompts=[], latents=None, rewards=rewards, rows=ranks.rank_rows(sizes), sizes=sizes, **fields)

    def credit(self, batch: Batch) -> Batch:
        """The gathered batch with its aggregated reward, validity and every hook's output (the same on every
        rank)."""
        total, valid = self.reward_set.aggregate(self.reward_aggregation, batch.rewards, batch.group_ids)
        if batch.completion_rewards is not None:  # a completion that could not be scored invalidates its row
            valid = valid & torch.isfinite(batch.completion_rewards).all(1)
        if not valid.any():
            bad = [n for n, s in batch.rewards.items() if not torch.isfinite(s).all()] or ["the ODE completions"]
            raise RuntimeError(f"every sample of the batch got a non-finite reward from {bad}; check the reward")
        return self.apply_hooks(dataclasses.replace(batch, total=total, valid=valid))

    def apply_hooks(self, batch: Batch) -> Batch:
        """``batch`` (with its ``total`` and ``valid``) with the edges trained once and every hook's output, in order:
        step rewards, advantages, loss weights (zero on rows without a valid reward), supervised weights."""
        batch = dataclasses.replace(batch, trained=batch.trained_once())
        diagnostics = {}
        for hook in ("step_rewards", "advantages", "loss_weights", "supervised_weights"):
            value, found = hook_value(getattr(self, hook)(batch))
            if hook == "loss_weights":
                value = value * batch.valid[:, None]  # a row without a valid reward trains nothing
            diagnostics.update(found)
            batch = dataclasses.replace(batch, **{hook: value})
        return dataclasses.replace(batch, diagnostics=diagnostics)

    def update(self, rollout: Rollout, cond: Conditioning, batch: Batch) -> dict[str, float]:
        """Train on the batch (``rollout``: this rank's rows, its ``train_mask`` and ``step_rewards`` this rank's
        share of the batch's); return the metrics to log as ``train/<key>``, among them
        :data:`~flowrl.methods.step_metrics.UPDATE_METRICS` (the loop adds ``forward_passes``, ``nonfinite_steps``
        and ``untrained_batches``). Each method defines its own."""
        raise NotImplementedError(f"{type(self).__name__} does not define update()")

    # -- hooks: on the batch gathered from every rank (their defaults: flowrl.methods.default_hooks) -----------

    step_rewards = default_hooks.step_rewards
    advantages = default_hooks.advantages
    advantage_groups = default_hooks.advantage_groups
    loss_weights = default_hooks.loss_weights
    supervised_weights = default_hooks.supervised_weights

