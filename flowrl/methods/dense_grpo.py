"""DenseGRPO (arXiv 2601.20218): a reward per denoising step from ODE completions, and a calibrated SDE noise.

Step ``k`` earns the reward gain ``dR[b, k] = R[b, k + 1] - R[b, k]`` (Eq. 7-9), where ``R[b, k]`` scores the ODE
completion (current policy, same guidance and schedule) of the latent before step ``k`` and ``R[b, T]`` the
trajectory's own final image; the gains telescope to ``R[b, T] - R[b, 0]``. Advantages normalise ``dR`` per
(group, step) across the group (Eq. 10, ``step_grpo``) and Flow-GRPO's PPO loss trains each step with its own.
Before training, exploration-space calibration (Alg. 1, :mod:`flowrl.sampling.noise_calibration`) tunes the noise
scale ``psi(k)`` of every step; it is saved in checkpoints and fixed during training.

Completions run on each rank for its own trajectories; ``dR`` is gathered with the rest of the batch by the loop,
so advantages are computed on the global batch as for every method.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from flowrl.data import data_parallel_rank
from flowrl.methods.batch import Batch
from flowrl.methods.flow_grpo import FlowGRPO
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.completions import Completions
from flowrl.sampling.noise_calibration import NoiseCalibration, calibration_update, noise_scale_factors
from flowrl.sampling.steps import MAX_NOISE_LEVEL

_CALIBRATION_SEED_OFFSET = 1 << 40  # calibration noise never repeats a training sample's seed


class DenseGRPO(FlowGRPO):
    """DenseGRPO. Options beyond Flow-GRPO's (:class:`~flowrl.methods.flow_grpo.FlowGRPO`):

    Args:
        completion_steps: Euler steps of each ODE completion (capped by the remaining steps); None: the full
            remaining schedule (the paper's default, 65 model evaluations per trajectory at T=10); 0: no model call,
            the one-step estimate from the velocity the sampler already computed.
        completion_chunk_size: at most this many completions per model call (memory); None: all at once.
        reward_chunk_size: at most this many completion images decoded and scored at once; None: all at once.
        calibration: exploration-space calibration (``samples``, ``iterations``, ``eps1``, ``eps2``), run on the
            first training batch's prompts; null keeps Flow-GRPO's noise ``noise_level * sqrt(sigma / (1 - sigma))``.
        advantage: ``step_grpo@flow_grpo``: the step rewards normalised per (group, step) with Flow-GRPO's numerics
            (population std, +1e-4, clip 5), Eq. 10.
    """

    step_credit = "a dense reward per step (one advantage per (row, step))"
    raw_rewards = True  # dR differences raw weighted rewards between completions

    def __init__(self, policy: FlowPolicy, completion_steps: Optional[int] = None,
                 completion_chunk_size: Optional[int] = None, reward_chunk_size: Optional[int] = None,
                 calibration: Optional[NoiseCalibration] = NoiseCalibration(), advantage: str = "step_grpo@flow_grpo",
                 **kwargs: Any):
        # **kwargs passed on unchanged: jsonargparse reads Flow-GRPO's signature through it (--help, YAML checks)
        super().__init__(policy, advantage=advantage, **kwargs)
        self.completion_steps, self.completion_chunk_size = completion_steps, completion_chunk_size
        self.reward_chunk_size = reward_chunk_size
        self.completions = Completions(completion_steps, completion_chunk_size, reward_chunk_size)
        self.calibration = calibration
        self.calibrated = False

    @classmethod
    def inapplicable_options(cls) -> tuple[str, ...]:
        """PODS's ``downsample_to`` (credit per step), and ``tail_compress``: its completions start at every state, so
        none may be skipped."""
        return super().inapplicable_options() + ("tail_compress",)

    @cached_property
    def noise_factors(self) -> Tensor:
        """``[T]`` each step's noise scale per unit of ``noise_level`` on the policy's schedule (read on first use:
        the schedule is the policy's configs', the options checked by then)."""
        return noise_scale_factors(self.policy.sigmas(self.num_steps).float(), self.step_kind)

    @cached_property
    def noise_scales(self) -> Tensor:
        """``[T]`` psi(k): Flow-GRPO's s_k until calibrated (a checkpoint's once resumed)."""
        return self.noise_level * self.noise_factors

    def rollout_cost(self) -> tuple[int, int]:
        """``T`` sampling evaluations and the completions of every state before a step (65 at ``T = 10``)."""
        T = self.num_steps
        return 1, T + Completions(self.completion_steps).evaluations(list(range(T)), T)

    def problems(self) -> list[str]:
        problems = super().problems() + self.completions.problems()
        calibration = self.calibration
        if isinstance(calibration, dict):  # given in Python as a mapping
            calibration = NoiseCalibration(**calibration)
        if calibration is None:
            return problems
        rise = calibration.iterations * calibration.eps2  # the most calibration can add to a step's noise scale
        level, kind = self.noise_level, self.step_kind
        if (bound := MAX_NOISE_LEVEL.get(kind)) is not None and level <= bound < level + rise:
            problems.append(f"model.calibration may raise the {kind} step's noise level (model.noise_level={level}) "
                            f"by up to iterations x eps2 = {rise:g}, past {bound:g}, where the step is undefined; set "
                            f"model.noise_level <= {bound - rise:g} or calibration: null")
        return problems + calibration.problems()

    # -- hooks ---------------------------------------------------------------------------------------------

    def noise_levels(self) -> Tensor:
        """``psi(k) / factor(k)``, so that the step applies ``psi(k)``; the loop's constant until calibrated."""
        return self.noise_scales / self.noise_factors if self.calibrated else super().noise_levels()

    def completion_starts(self) -> Tensor:
        """Every state before a step: ``completion_rewards [B, T]``."""
        return torch.arange(self.num_steps)

    def step_rewards(self, batch: Batch) -> Tensor:
        """``dR [B, T]``: ``R[:, 1:] - R[:, :-1]`` with ``R = [completion_rewards, total]`` (invalid rows: 0, and
        masked out by the loop)."""
        total = batch.total
        rewards = torch.cat([batch.completion_rewards.to(total), total[:, None]], dim=1)  # [B, T+1]
        return rewards.diff(dim=1).nan_to_num(0.0)

    # -- exploration-space calibration ---------------------------------------------------------------------

    def calibration_evaluations(self) -> int:
        """Model evaluations the calibration still adds to the first batch: ``iterations x samples`` rollouts of
        :meth:`rollout_cost` each (0 once calibrated, or without calibration); the run header counts them."""
        if self.calibration is None or self.calibrated:
            return 0
        samples, evaluations = self.rollout_cost()
        return self.calibration.iterations * self.calibration.samples * evaluations // samples

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        if self.calibration is not None and not self.calibrated:
            self.calibrate(batch)

    @torch.no_grad()
    def calibrate(self, batch: dict) -> Tensor:
        """Alg. 1 on ``calibration.samples`` trajectories per iteration (split over ranks) of the batch's prompts.

        Returns:
            the calibrated ``psi [T]`` (also in ``self.noise_scales``; identical on every rank).
        """
        (rank, world), options = data_parallel_rank(self.trainer), self.calibration  # replicas sample the shares
        if options.samples % world:
            raise ValueError(f"model.calibration.samples={options.samples} must be a multiple of the "
                             f"{world} data-parallel replicas (each samples an equal share)")
        local = options.samples // world
        pool = self._calibration_prompt_pool(batch)
        prompts, images = zip(*[pool[(rank * local + i) % len(pool)] for i in range(local)])
        records = {"prompts": list(prompts), "images": None if images[0] is None else list(images)}
        cond = self.generation.encode(records)
        self.policy.eval()
        self.calibrated = True  # sample with psi from here on
        for iteration in range(options.iterations):
            first = _CALIBRATION_SEED_OFFSET + self.seed * 1_000_003 + iteration * options.samples + rank * local
            part = {**records, "group_ids": torch.zeros(local, dtype=torch.long, device=self.device),
                    "seeds": torch.arange(first, first + local)}
            rollout = self.rollout_and_score(part, cond)
            self.unlogged_evaluations += float(rollout.nfe.sum())  # counted in the next rollout/evaluations
            total, valid = self.reward_set.total(rollout.rewards)
            rewards = torch.cat([rollout.completion_rewards.to(total), torch.where(valid, total, torch.nan)[:, None]],
                                dim=1)
            gains = self.ranks.gather(rewards.diff(dim=1), [local] * world)
            self.noise_scales = calibration_update(self.noise_scales, gains.cpu(), options.eps1, options.eps2)
        rank_zero_info(f"DenseGRPO calibrated noise scales psi(k): {[round(x, 4) for x in self.noise_scales.tolist()]}")
        return self.noise_scales

    def _calibration_prompt_pool(self, batch: dict) -> list[tuple[str, Optional[list[Tensor]]]]:
        """The global batch's distinct prompt records (prompt, and its images or None) in prompt-id order (the same
        for any number of processes); the local batch's where the data module does not expose ``prompts`` and
        ``prompt_ids``."""
        datamodule = getattr(self.trainer, "datamodule", None)
        texts = getattr(datamodule, "prompts", None)
        if texts is None or "prompt_ids" not in batch:
            return list(zip(batch["prompts"], batch.get("images") or [None] * len(batch["prompts"])))
        ids = batch["prompt_ids"].to(self.device)
        ids = self.ranks.gather(ids, self.ranks.rank_sizes(len(ids))).unique().tolist()
        loader = getattr(datamodule, "train_images", None)  # an edit's sources, an image-to-video's first frame
        return list(zip([texts[i] for i in ids], loader(ids) if loader is not None else [None] * len(ids)))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["dense_grpo"] = {"noise_scales": self.noise_scales.clone(), "calibrated": self.calibrated}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("dense_grpo")
        if state is not None:
            self.noise_scales, self.calibrated = state["noise_scales"].float().cpu(), bool(state["calibrated"])
