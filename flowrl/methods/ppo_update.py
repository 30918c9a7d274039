"""The PPO update: epochs of clipped policy-gradient steps over the trained (row, step) pairs of one rollout batch.

A component, not a module: :class:`~flowrl.methods.policy_gradient.PolicyGradient` holds one and hands it itself
as the ``host`` (the transition under the current weights, backward through the strategy, the gradient sync and the
checked optimizer step). Per epoch the pairs gathered over every rank are shuffled into ``num_minibatches``
minibatches (:mod:`flowrl.methods.micro_batches`), each rank computes its own rows' share in micro-batches with the
gradient all-reduce only on the last one, and every rank takes one optimizer step per minibatch. Before the first
epoch it can recompute the old log-probs (``recompute_log_probs``) and check that the ratio is 1 (``check_ratio``).
The KL to the reference policy is the exact Gaussian KL between the two transitions' means.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from flowrl import losses
from flowrl.methods.fsdp2_strategy import forward_is_collective
from flowrl.methods.micro_batches import Minibatch, rank_minibatches
from flowrl.policies.base import Conditioning
from flowrl.sampling.rollout import Rollout


@dataclass
class PPOUpdate:
    """Options of the update (the method's ``--help`` documents each)."""

    loss: str = "vanilla"
    loss_options: dict[str, Any] = field(default_factory=dict)
    beta: float = 0.0
    num_inner_epochs: int = 1
    num_minibatches: int = 1
    micro_batch_size: int = 16
    check_ratio: bool = False
    check_ratio_threshold: float = 1e-3
    recompute_log_probs: bool = False

    def minibatches(self, pairs: Tensor, gen: torch.Generator, rows: tuple[int, int] = (0, -1),
                    host=None) -> list[Minibatch]:
        """One epoch of the gathered ``pairs`` shuffled into minibatches, this rank's ``rows`` of each in
        micro-batches; whole samples for a sequence-level loss (``gspo``). Where the host's forward passes are
        collectives (FSDP), each minibatch is padded to the most micro-batches any rank has (one all-reduce)."""
        out = rank_minibatches(pairs, gen, self.num_minibatches, self.micro_batch_size,
                               whole_samples=losses.is_sequence_level(self.loss), rows=rows)
        if host is None or not forward_is_collective(host.trainer.strategy):
            return out
        counts = torch.tensor([len(mb.micro) for mb in out], device=host.device)
        most = host.trainer.strategy.reduce(counts, reduce_op="max").tolist()
        return [dataclasses.replace(mb, padding=n - len(mb.micro)) for mb, n in zip(out, most)]

    def micro_batches(self, pairs: Tensor, gen: torch.Generator) -> list[list[Tensor]]:
        """One epoch of one rank's shuffled micro-batches per minibatch."""
        return [mb.micro for mb in self.minibatches(pairs, gen)]

    def run(self, host, rollout: Rollout, cond: Conditioning, advantages: Tensor, weights: Tensor,
            global_mask: Tensor, rows: slice, seed: int, supervised: Optional[Tensor] = None) -> dict[str, float]:
        """The update of one batch; returns the metrics to log (means over this rank's pairs).

        Args:
            host: the method (``transition``, ``manual_backward``, ``no_sync``, ``finite_optimizer_step``, ...).
            rollout: this rank's rows, whose ``train_mask`` are the pairs it trains.
            advantages, weights: ``[B, T]`` this rank's. global_mask: ``[B_all, T]`` the trained pairs of every
                rank, in rank order; ``rows`` this rank's rows of it. seed: of this batch's shuffles.
            supervised: ``[B, T]`` this rank's weights of a likelihood term ``-w log p(pair)`` added to the policy
                loss (LayerTuning-RL); None: none.
        """
        host.policy.train()
        opt = host.optimizers()
        pairs = rollout.train_mask.nonzero()  # [P, 2] (row, step)
        global_pairs = global_mask.nonzero()  # [P_all, 2]
        world = host.trainer.world_size
        own = (rows.start, rows.stop) if world > 1 else (0, -1)
        gen = torch.Generator().manual_seed(seed)
        checked = {}
        # a pair this rank can compute, for the weight-0 micro-batches that keep forward counts equal under FSDP
        filler = pairs[:1] if len(pairs) else global_pairs[:1] * torch.tensor([0, 1], device=global_pairs.device)
        first_epoch = [mb.micro + [filler] * mb.padding
                       for mb in self.minibatches(global_pairs, torch.Generator().manual_seed(seed), own, host)
                       ] if self.recompute_log_probs or (self.check_ratio and host.global_step == 0) else []
        if self.recompute_log_probs:
            rollout = dataclasses.replace(rollout, log_probs=self.recomputed_log_probs(host, rollout, cond,
                                                                                         first_epoch, filler))
        if self.check_ratio and host.global_step == 0:
            checked["check_ratio_max_dev"] = self.on_policy_ratio_deviation(host, rollout, cond, advantages, weights,
                                                                            first_epoch, filler)
        sums: dict[str, float] = {}
        extremes = {"ratio_min": float("inf"), "ratio_max": float("-inf")}
        grad_norms: list[float] = []
        skipped = 0
        for _ in range(self.num_inner_epochs):
            for minibatch in self.minibatches(global_pairs, gen, own, host):
                finite = True
                chunks = minibatch.micro + [filler] * minibatch.padding
                for i, chunk in enumerate(chunks):
                    with nullcontext() if i == len(chunks) - 1 else host.no_sync():
                        loss, stats = self.pair_loss(host, rollout, cond, advantages, weights, chunk, supervised)
                        # DDP averages gradients over ranks: scaled so the result is the minibatch's mean
                        host.manual_backward(loss * (len(chunk) * world) / minibatch.size if i < len(minibatch.micro)
                                             else loss * 0.0)
                    if i >= len(minibatch.micro):  # padding: its forward and backward only keep FSDP's collectives
                        continue
                    finite &= bool(torch.isfinite(loss))
                    extremes["ratio_min"] = min(extremes["ratio_min"], stats.pop("ratio_min"))
                    extremes["ratio_max"] = max(extremes["ratio_max"], stats.pop("ratio_max"))
                    for key, value in stats.items():
                        sums[key] = sums.get(key, 0.0) + value * len(chunk)
                if not chunks:  # none of this minibatch's pairs are here (DDP): join its gradient sync with zeros
                    host.manual_backward(sum(p.sum() for p in host.policy.trainable_parameters()) * 0.0)
                grad_norm = host.finite_optimizer_step(opt, finite)
                if grad_norm is None:
                    skipped += 1
                else:
                    grad_norms.append(grad_norm)
        count = max(len(pairs), 1) * self.num_inner_epochs
        out = {key: value / count for key, value in sums.items()}
        if len(pairs):  # a rank may hold no trained pair of this batch
            out.update(extremes, ratio_max_dev=max(extremes["ratio_max"] - 1, 1 - extremes["ratio_min"]))
        # before clipping, mean over the optimizer steps taken
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["nonfinite_steps"] = float(skipped)
        return {**out, **checked}

    def pair_loss(self, host, rollout: Rollout, cond: Conditioning, advantages: Tensor, weights: Tensor,
                  pairs: Tensor, supervised: Optional[Tensor] = None) -> tuple[Tensor, dict[str, float]]:
        """Mean policy loss (+ beta KL, + ``supervised[b, k] * -log p`` where given) over ``pairs [P, 2]`` and its
        diagnostics.

        The pairs are laid out as ``[R, T]`` rows (one per sample of the micro-batch) for ``flowrl.losses``, so a
        sequence-level loss sees each sample's trained steps together; the reduction is the weighted mean over pairs.
        """
        b, k = pairs[:, 0], pairs[:, 1]
        out = host.transition(rollout, cond, pairs)
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
            with torch.no_grad(), host.policy.reference():
                ref = host.transition(rollout, cond, pairs)
            kl = losses.gaussian_mean_kl(out.mean, ref.mean, out.std)  # [P]
            per_pair = per_pair + self.beta * kl
            metrics["kl"] = kl.mean().item()
        if supervised is not None:
            term = -supervised[b, k] * out.log_prob  # [P]
            per_pair = per_pair + term
            metrics["supervised_loss"] = term.mean().item()
        metrics["loss"] = (per_pair * w).mean().item()
        return (per_pair * w).mean(), metrics

    @torch.no_grad()
    def on_policy_ratio_deviation(self, host, rollout: Rollout, cond: Conditioning, advantages: Tensor,
                                  weights: Tensor, epoch: list[list[Tensor]], filler: Optional[Tensor] = None) -> float:
        """max |ratio - 1| over every trained pair with the unchanged weights, in the update's micro-batches ``epoch``
        (the first epoch's, so each pair is recomputed in the same batch composition as its first training pass;
        chunks that are ``filler`` only pad the forward count and are left out). Warns on rank zero above
        ``check_ratio_threshold``."""
        deviation = 0.0
        for micro in epoch:
            for chunk in micro:
                _, stats = self.pair_loss(host, rollout, cond, advantages, weights, chunk)
                if chunk is filler:
                    continue
                deviation = max(deviation, stats["ratio_max"] - 1, 1 - stats["ratio_min"])
        if deviation > self.check_ratio_threshold:
            rank_zero_warn(f"check_ratio: max |ratio - 1| = {deviation:.3g} with unchanged weights exceeds "
                           f"check_ratio_threshold={self.check_ratio_threshold:g}; the recomputed log-probs differ "
                           "from the sampled ones (precision, batch-size-dependent kernels or dropout), so clipping "
                           "will fire off-policy. Try autocast null / float32, or a larger clip_range.")
        return deviation

    @torch.no_grad()
    def recomputed_log_probs(self, host, rollout: Rollout, cond: Conditioning, epoch: list[list[Tensor]],
                             filler: Optional[Tensor] = None) -> Tensor:
        """The rollout's log-probs with every trained pair's replaced by its value under the current weights,
        computed in the micro-batches ``epoch`` (the update's first epoch, so each pair in its batch composition;
        chunks that are ``filler`` only pad the forward count and are left out)."""
        log_probs = rollout.log_probs.clone()
        for micro in epoch:
            for chunk in micro:
                log_prob = host.transition(rollout, cond, chunk).log_prob
                if chunk is not filler:
                    log_probs[chunk[:, 0], chunk[:, 1]] = log_prob
        return log_probs

