"""What the likelihood-free methods (TDM-R1, DiffusionNFT) train from: trajectories of a deterministic (or any) sampler,
their final images scored by the reward set, and one group advantage per sample computed on the batch gathered from
every rank (so a 2-process run gets the advantages of a 1-process run), with this rank's rows handed back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl import advantages as adv_lib
from flowrl.methods.base import reward_metadata
from flowrl.policies.base import Conditioning
from flowrl.sampling.sampler import VelocityFn, sample, sde_steps


@dataclass
class OutcomeRollout:
    """One rank's rows. ``latents [B, T+1, ...]`` (the clean sample last), ``sigmas [T+1]``, ``images [B, 3, H, W]``,
    ``scores {name: [B]}``, ``total``/``valid``/``advantages [B]`` (this rank's), and the gathered
    ``all_group_ids``/``all_advantages [B_all]`` with ``rows``, this rank's slice of them."""

    latents: Tensor
    sigmas: Tensor
    images: Tensor
    scores: dict[str, Tensor]
    total: Tensor
    valid: Tensor
    advantages: Tensor
    all_group_ids: Tensor
    all_advantages: Tensor
    rows: slice
    sizes: list[int]
    sampling_s: float


def group_advantages(advantage: str, options: dict[str, Any], total: Tensor, valid: Tensor,
                     group_ids: Tensor) -> Tensor:
    """One advantage per row ``[B]`` from the estimator ``advantage`` (e.g. ``grpo@flow_grpo``) over the valid rows;
    0 for rows whose reward was not finite."""
    out = torch.zeros_like(total)
    mask = torch.ones(int(valid.sum()), 1, dtype=torch.bool, device=total.device)
    out[valid] = adv_lib.compute(advantage, total[valid, None], mask, group_ids[valid], **options)[:, 0]
    return out


@torch.no_grad()
def sample_and_score(host, batch: dict, velocity: VelocityFn, num_steps: int, step_kind: str,
                     noise_level: float = 0.7, advantage: str = "grpo@flow_grpo",
                     advantage_options: Optional[dict[str, Any]] = None) -> OutcomeRollout:
    """Sample ``batch`` with ``velocity`` (``step_kind``: an ODE or SDE step of :mod:`flowrl.sampling.steps`), score
    the final images with the host's reward set, and compute group advantages on the batch of every rank.

    Raises:
        RuntimeError: every sample of the (global) batch got a non-finite reward.
    """
    started = time.perf_counter()
    sigmas = host.policy.sigmas(num_steps).to(host.device)
    latents, _ = sample(velocity, batch["seeds"], sigmas, host.policy.latent_shape(), step_kind, noise_level,
                        sde_steps(num_steps, step_kind), host.device)
    images = host.policy.decode(latents[:, -1])
    scores = host.reward_set.score(images, batch["prompts"], reward_metadata(batch))
    sampling_s = time.perf_counter() - started
    sizes = host.rank_sizes(len(batch["seeds"]))
    rows = host.rank_rows(sizes)
    group_ids = host.gather(batch["group_ids"], sizes)
    total, valid = host.reward_set.aggregate("sum", {k: host.gather(v, sizes) for k, v in scores.items()}, group_ids)
    if not valid.any():
        bad = [n for n, s in scores.items() if not torch.isfinite(s).all()]
        raise RuntimeError(f"every sample of the batch got a non-finite reward from {bad}; check the reward")
    adv = group_advantages(advantage, advantage_options or {}, total, valid, group_ids)
    return OutcomeRollout(latents=latents, sigmas=sigmas, images=images, scores=scores, total=total[rows],
                          valid=valid[rows], advantages=adv[rows], all_group_ids=group_ids, all_advantages=adv,
                          rows=rows, sizes=sizes, sampling_s=sampling_s)


def log_outcome(host, rollout: OutcomeRollout, nfe: float, metrics: dict[str, float], guidance: float = 1.0) -> None:
    """The reward, advantage and rollout metrics every method logs (``train/reward/<name>``, ``train/reward/total``,
    ``train/advantage/{mean,std}``, ``rollout/{nfe,samples_per_s}``, ``rollout/evaluations``: the batch's over every
    rank, a CFG pair counted once as the loop does, ``rollout/forward_passes``: ``nfe`` doubled under CFG), then
    ``train/<key>`` of ``metrics``."""
    size = len(rollout.total)
    log = lambda name, value, **kw: host.log(name, value, batch_size=size, **kw)  # noqa: E731
    for name, scores in rollout.scores.items():
        finite = torch.isfinite(scores)
        log(f"train/reward/{name}", scores[finite].mean() if finite.any() else torch.nan, sync_dist=True)
    log("train/reward/total", rollout.total[rollout.valid].mean() if rollout.valid.any() else torch.nan,
        prog_bar=True, sync_dist=True)
    log("train/advantage/mean", rollout.all_advantages.mean())
    log("train/advantage/std", rollout.all_advantages.std() if len(rollout.all_advantages) > 1 else torch.zeros(()))
    log("rollout/nfe", float(nfe))
    log("rollout/evaluations", torch.tensor(float(nfe) * size), reduce_fx="sum", sync_dist=True)  # every rank's
    log("rollout/forward_passes", float(nfe) * (2 if guidance != 1.0 else 1))
    log("rollout/samples_per_s", size / max(rollout.sampling_s, 1e-9))
    for key, value in metrics.items():
        log(f"train/{key}", value)


def outputs(rollout: OutcomeRollout, batch: dict) -> dict[str, Any]:
    """``training_step``'s return value, as the loop's (sample grids, dumps and tests read it)."""
    return {"images": rollout.images, "prompts": batch["prompts"], "rewards": rollout.total, "seeds": batch["seeds"],
            "group_ids": batch["group_ids"], "advantages": rollout.advantages, "scores": rollout.scores}


def select(cond: Conditioning, rows: Tensor) -> Conditioning:
    """``cond``'s rows ``rows`` (all of them without a copy when ``rows`` is every row in order)."""
    if len(rows) == len(cond.embeds) and torch.equal(rows.cpu(), torch.arange(len(rows))):
        return cond
    return cond.select(rows)
