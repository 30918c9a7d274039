"""The base of every method: a LightningModule that owns the policy, the reward set, generation and evaluation,
the collectives across ranks and the optimizer steps, and nothing of any algorithm.

Policy-gradient methods build on :class:`~flowrl.methods.policy_gradient.PolicyGradient`; a method that trains no
log-prob ratio (TDM-R1, DiffusionNFT) subclasses this module directly and writes its own ``training_step``, so none
of PPO's options appear in its ``--help``. ``python -m flowrl fit`` accepts any subclass.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.distributed.tensor import DTensor

from flowrl.methods.deepspeed_steps import accumulating, deepspeed_engine, deepspeed_step
from flowrl.methods.fsdp2_strategy import shard_for_strategy
from flowrl.methods.options import base_option_problems
from flowrl.output_dirs import output_dir_problems
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.rewards.aggregate import tally_means
from flowrl.rewards.reward_set import RewardSet
from flowrl.sampling.sampler import VelocityFn, sample
from flowrl.sampling.steps import ODE_STEPS

# ModelCheckpoint warns under manual optimization that checkpoints hold the weights after the optimizer step: that is
# what resuming an RL run needs (the next batch samples from the updated policy; tests/cli/test_fit.py resumes exactly)
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")


class BaseModule(LightningModule):
    """Options every method has (all appear in ``python -m flowrl fit --help``).

    Args:
        policy: the policy adapter (``flowrl.policies.*``).
        num_steps: sampling steps ``T`` of a training rollout.
        eval_num_steps: ODE steps of validation samples (None: ``num_steps``).
        guidance_scale: classifier-free guidance at sampling and training (1 disables it).
        optimizer: e.g. ``{class_path: torch.optim.AdamW, init_args: {lr: 3e-4}}``.
        max_grad_norm: clip the gradient norm to this before each optimizer step (None disables).
        max_nonfinite_steps: an optimizer step whose loss or gradient norm is NaN or inf (on any rank) is skipped
            and counted (``train/nonfinite_steps``); this many skipped in a row stop the run with an error naming
            the quantity.
        seed: seeds the method's own randomness (the shuffling of training pairs, calibration noise).
    """

    scores_own_rewards = True  # reward callbacks must not score validation outputs a second time
    option_problems = staticmethod(base_option_problems)  # the CLI checks a config with it before loading weights
    min_group_size = 2  # samples per prompt a method needs (1: a method that groups one tree per prompt)

    def __init__(self, policy: FlowPolicy, num_steps: int = 10, eval_num_steps: Optional[int] = None,
                 guidance_scale: float = 4.5, optimizer: OptimizerCallable = torch.optim.AdamW,
                 max_grad_norm: Optional[float] = 1.0, max_nonfinite_steps: int = 3, seed: int = 0):
        super().__init__()
        problems = base_option_problems(num_steps=num_steps, max_nonfinite_steps=max_nonfinite_steps)
        if problems:
            raise ValueError("invalid method settings:\n  " + "\n  ".join(problems))
        self.automatic_optimization = False
        self.policy = policy
        self.num_steps, self.eval_num_steps = num_steps, eval_num_steps or num_steps
        self.guidance_scale, self.optimizer_factory = guidance_scale, optimizer
        self.max_grad_norm, self.max_nonfinite_steps, self.seed = max_grad_norm, max_nonfinite_steps, seed
        self.nonfinite_in_a_row = 0  # skipped optimizer steps since the last finite one (checkpointed)
        self._reward_set: Optional[tuple[int, RewardSet]] = None

    def configure_optimizers(self):
        return self.optimizer_factory(self.policy.trainable_parameters())

    def configure_model(self) -> None:
        # Lightning calls this under every strategy, before the optimizers exist; only FSDP2 changes the model here
        shard_for_strategy(self.trainer.strategy, self.policy)

    # -- rewards -------------------------------------------------------------------------------------------

    @property
    def reward_set(self) -> RewardSet:
        """The reward callbacks on the trainer as one :class:`~flowrl.rewards.reward_set.RewardSet` (built once per
        trainer)."""
        callbacks = self.trainer.callbacks
        if self._reward_set is None or self._reward_set[0] != id(callbacks):
            self._reward_set = (id(callbacks), RewardSet(callbacks))
        return self._reward_set[1]

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

    # -- ranks ---------------------------------------------------------------------------------------------

    def rank_sizes(self, local: int) -> list[int]:
        """Rows on every rank (one collective; ranks may hold different numbers)."""
        if self.trainer.world_size == 1:
            return [local]
        sizes = self.all_gather(torch.tensor(local, device=self.device))
        return [int(s) for s in sizes.flatten().tolist()]

    def gather(self, x: Tensor, sizes: list[int]) -> Tensor:
        """``x [sizes[rank], ...]`` of every rank, concatenated in rank order (padded for the collective)."""
        if len(sizes) == 1:
            return x
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[:x.shape[0]] = x
        everyone = self.all_gather(padded)  # [W, max, ...]
        return torch.cat([everyone[r, :n] for r, n in enumerate(sizes)])

    def rank_rows(self, sizes: list[int]) -> slice:
        """This rank's rows of a tensor gathered with ``sizes``."""
        rank = self.trainer.global_rank if len(sizes) > 1 else 0
        start = sum(sizes[:rank])
        return slice(start, start + sizes[rank])

    def no_sync(self):
        """Skip the gradient all-reduce of a non-final micro-batch (DDP, FSDP2; DeepSpeed: not an accumulation
        boundary); a no-op on one device."""
        from contextlib import nullcontext

        if (engine := deepspeed_engine(self.trainer)) is not None:
            return accumulating(engine)
        block = getattr(self.trainer.strategy, "block_backward_sync", None)
        return block() if block is not None else nullcontext()

    # -- optimizer steps -----------------------------------------------------------------------------------

    def grad_norm(self, parameters: Optional[list] = None) -> float:
        grads = [p.grad for p in (parameters or self.policy.trainable_parameters()) if p.grad is not None]
        if not grads:
            return 0.0
        norm = torch.nn.utils.get_total_norm(grads)
        # FSDP2: the gradients are shards (DTensors), and so is their norm until reduced: the global norm is wanted
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)

    def finite_optimizer_step(self, optimizer, loss_finite: bool, parameters: Optional[list] = None) -> Optional[float]:
        """Clip and take the optimizer step unless the loss or the gradient norm is non-finite on any rank, then zero
        the gradients. Returns the gradient norm before clipping, or None for a skipped step."""
        if (engine := deepspeed_engine(self.trainer)) is not None:  # its optimizer owns the gradients and clipping
            return deepspeed_step(self, engine, optimizer, loss_finite)
        grad_norm = self.grad_norm(parameters)
        if self.skip_nonfinite_step(loss_finite, grad_norm):
            optimizer.zero_grad()
            return None
        if self.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad()
        return grad_norm

    def skip_nonfinite_step(self, loss_finite: bool, grad_norm: float) -> bool:
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
        what = "loss" if not loss_finite else "gradient"
        rank_zero_warn(f"skipped optimizer step {self.global_step}: non-finite {what} ({self.nonfinite_in_a_row} in a "
                       f"row; the run stops at model.max_nonfinite_steps={self.max_nonfinite_steps})")
        return True

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["flowrl_loop"] = {"nonfinite_in_a_row": self.nonfinite_in_a_row}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.nonfinite_in_a_row = checkpoint.get("flowrl_loop", {}).get("nonfinite_in_a_row", 0)

    # -- generation and evaluation -------------------------------------------------------------------------

    def velocity_fn(self, cond: Conditioning, cond_rows: Optional[Tensor] = None) -> VelocityFn:
        """The policy's guided velocity for rows conditioned by ``cond``'s rows ``cond_rows`` (None: all, in order)."""
        if cond_rows is not None and not torch.equal(cond_rows.cpu(), torch.arange(len(cond.embeds))):
            cond = cond.select(cond_rows)
        return lambda z, sigma: self.policy.velocity(z, sigma, cond, self.guidance_scale)

    def encode(self, batch: dict) -> Conditioning:
        """The policy's conditioning of a batch's ``prompts`` and, where its prompt records carry them, ``images``."""
        return self.policy.encode(batch["prompts"], images=batch.get("images"))

    @torch.no_grad()
    def generate(self, prompts: list[str], seeds: Tensor, num_steps: Optional[int] = None,
                 images: Optional[list] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` from the deterministic ODE sampler (no noise after the seeded start); ``images``:
        the prompts' conditioning images, for an editing or image-to-video policy."""
        cond = self.encode({"prompts": prompts, "images": images})
        sigmas = self.policy.sigmas(num_steps or self.eval_num_steps).to(self.device)
        ode = ODE_STEPS[self.policy.prediction]
        latents, _ = sample(self.velocity_fn(cond), seeds, sigmas, self.policy.latent_shape(), ode, device=self.device)
        return self.policy.decode(latents[:, -1])

    def _tally(self, batch: dict) -> dict[str, Tensor]:
        """The reward set's tally of the ODE samples of a batch's ``prompts`` from its ``seeds``."""
        images = self.generate(batch["prompts"], batch["seeds"].to(self.device), images=batch.get("images"))
        return self.reward_set.tally(self.reward_set.score(images, batch["prompts"], reward_metadata(batch)))

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
    def evaluate(self, batches: list[dict]) -> dict[str, float]:
        """Mean reward per name (and ``total``) over evaluation batches of ``prompts`` and ``seeds`` on every rank
        (call it on every rank), with ``<name>_nonfinite`` counts where scores were NaN or inf (left out of the means).
        """
        was_training = self.policy.training
        self.policy.eval()
        tallies = [self._tally(batch) for batch in batches]
        self.policy.train(was_training)
        return self._reduced_means(tallies)

    # -- prediction (python -m flowrl predict) -------------------------------------------------------------

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
                scores[reward.name] = reward.score(images, batch["prompts"], reward_metadata(batch)).detach().float().cpu()
            except (ValueError, TypeError) as err:  # a prompt this reward cannot read: the images are still wanted
                rank_zero_warn(f"reward {reward.name!r} cannot score these prompts, its scores are NaN: {err}")
                scores[reward.name] = torch.full((len(batch["prompts"]),), torch.nan)
        return {**batch, "images": images.float().cpu(), "rewards": scores}


def reward_metadata(batch: dict) -> dict:
    """What a reward sees besides the images and prompts: the rows' ``group_ids`` and ``seeds`` where the batch has
    them, and each prompt's conditioning ``images`` (an edit's source, a video's first frame) where it has them."""
    return {key: batch[key] for key in ("group_ids", "seeds", "images") if key in batch}
