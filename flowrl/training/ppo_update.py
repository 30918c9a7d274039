"""The PPO update: epochs of clipped policy-gradient steps over the trained (row, step) pairs of one rollout batch.

A component: it takes the batch it trains (:class:`UpdateBatch`), the transition of a pair under the current weights
(and under the reference's, for the KL) as callables, and the training loop's :class:`~flowrl.training.steps.
TrainingSteps`; nothing of a LightningModule. Per epoch the pairs gathered over every rank are shuffled into
``num_minibatches`` minibatches (:mod:`flowrl.training.micro_batches`), each rank computes its own rows' share in
micro-batches with the gradient sync only on the last one, and every rank takes one optimizer step per minibatch.
Before the first epoch it can recompute the old log-probs (``recompute_log_probs``) and check that the ratio is 1
(``check_ratio``). The KL to the reference policy is the exact Gaussian KL between the two transitions' means. A loss
that reads the step's mean shift (``dppo``, ``grpo_guard``: :func:`~flowrl.losses.policy_loss_needs`) gets the old
means from that same replay before the first epoch (one no-gradient forward per trained pair, shared with
``recompute_log_probs``), and per pair ``mean_sq_diff``, ``std`` and ``dt`` from the current transition.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from flowrl import losses
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.steps import StepOutput
from flowrl.training.micro_batches import Minibatch, rank_minibatches
from flowrl.training.steps import TrainingSteps

#: ``transition(pairs [P, 2]) -> StepOutput``: the sampler step of (row, step) pairs from their recorded states, with
#: the log-prob of the recorded next state.
Transition = Callable[[Tensor], StepOutput]


@dataclass
class UpdateBatch:
    """What one update trains: ``rollout`` (this rank's rows; its ``train_mask`` the pairs this rank trains, its
    ``log_probs`` the old ones), ``advantages`` and ``weights`` ``[B, T]`` (this rank's), ``global_mask [B_all, T]``
    the trained pairs of every rank in rank order with ``rows`` this rank's rows of it, ``supervised [B, T]`` the
    weights of a likelihood term ``-w log p(pair)`` beside the policy loss (LayerTuning-RL; None: none), and
    ``kl_scale [B, T]`` the factor of each pair's exact KL in the convention ``beta`` is stated in (None: 1), and
    ``old_means [B, T, ...]`` the transitions' means before the update (set by :meth:`PPOUpdate.run` for a loss that
    needs them)."""

    rollout: Rollout
    advantages: Tensor
    weights: Tensor
    global_mask: Tensor
    rows: slice
    supervised: Optional[Tensor] = None
    kl_scale: Optional[Tensor] = None
    old_means: Optional[Tensor] = None


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
                    steps: Optional[TrainingSteps] = None) -> list[Minibatch]:
        """One epoch of the gathered ``pairs`` shuffled into minibatches, this rank's ``rows`` of each in
        micro-batches; whole samples for a sequence-level loss (``gspo``). Where forward passes are collectives
        (``steps.collective_forward``: FSDP), each minibatch is padded to the most micro-batches any rank has (one
        all-reduce)."""
        out = rank_minibatches(pairs, gen, self.num_minibatches, self.micro_batch_size,
                               whole_samples=losses.is_sequence_level(self.loss), rows=rows)
        if steps is None or not steps.collective_forward:
            return out
        counts = torch.tensor([len(mb.micro) for mb in out], device=pairs.device)
        most = steps.reduce_max(counts).tolist()
        return [dataclasses.replace(mb, padding=n - len(mb.micro)) for mb, n in zip(out, most)]

    def micro_batches(self, pairs: Tensor, gen: torch.Generator) -> list[list[Tensor]]:
        """One epoch of one rank's shuffled micro-batches per minibatch."""
        return [mb.micro for mb in self.minibatches(pairs, gen)]

    def run(self, batch: UpdateBatch, transition: Transition, reference: Optional[Transition], steps: TrainingSteps,
            optimizer: Any, seed: int, check_ratio: bool = False) -> dict[str, float]:
        """The update of one batch; returns the metrics to log (means over this rank's pairs).

        Args:
            batch: what to train. transition: a pair's step under the current weights (carrying the gradient);
                reference: under the reference policy, without a gradient (needed when ``beta > 0``).
            steps: the training loop's backward, gradient sync, optimizer step and collectives. optimizer: what
                ``steps.optimizer_step`` steps. seed: of this batch's shuffles. check_ratio: measure the on-policy
                ratio before the first epoch (``check_ratio_max_dev``).
        """
        pairs = batch.rollout.train_mask.nonzero()  # [P, 2] (row, step)
        global_pairs = batch.global_mask.nonzero()  # [P_all, 2]
        world = steps.world_size
        own = (batch.rows.start, batch.rows.stop) if world > 1 else (0, -1)
        gen = torch.Generator().manual_seed(seed)
        checked = {}
        # a pair this rank can compute, for the weight-0 micro-batches that keep forward counts equal under FSDP
        filler = pairs[:1] if len(pairs) else global_pairs[:1] * torch.tensor([0, 1], device=global_pairs.device)
        means = "mean_sq_diff" in losses.policy_loss_needs(self.loss)
        first_epoch = [mb.micro + [filler] * mb.padding
                       for mb in self.minibatches(global_pairs, torch.Generator().manual_seed(seed), own, steps)
                       ] if self.recompute_log_probs or check_ratio or means else []
        if self.recompute_log_probs or means:
            log_probs, old_means = self.replay(batch.rollout, transition, first_epoch, filler, means)
            rollout = dataclasses.replace(batch.rollout, log_probs=log_probs) if self.recompute_log_probs else None
            batch = dataclasses.replace(batch, rollout=rollout or batch.rollout, old_means=old_means)
        if check_ratio:
            checked["check_ratio_max_dev"] = self.on_policy_ratio_deviation(batch, transition, reference,
                                                                            first_epoch, filler)
        sums: dict[str, float] = {}
        extremes = {"ratio_min": float("inf"), "ratio_max": float("-inf")}
        grad_norms: list[float] = []
        skipped = 0
        for _ in range(self.num_inner_epochs):
            for minibatch in self.minibatches(global_pairs, gen, own, steps):
                finite = True
                chunks = minibatch.micro + [filler] * minibatch.padding
                for i, chunk in enumerate(chunks):
                    with nullcontext() if i == len(chunks) - 1 else steps.no_sync():
                        loss, stats = self.pair_loss(batch, transition, reference, chunk)
                        # DDP averages gradients over ranks: scaled so the result is the minibatch's mean
                        steps.backward(loss * (len(chunk) * world) / minibatch.size if i < len(minibatch.micro)
                                       else loss * 0.0)
                    if i >= len(minibatch.micro):  # padding: its forward and backward only keep FSDP's collectives
                        continue
                    finite &= bool(torch.isfinite(loss))
                    extremes["ratio_min"] = min(extremes["ratio_min"], stats.pop("ratio_min"))
                    extremes["ratio_max"] = max(extremes["ratio_max"], stats.pop("ratio_max"))
                    for key, value in stats.items():
                        sums[key] = sums.get(key, 0.0) + value * len(chunk)
                if not chunks:  # none of this minibatch's pairs are here (DDP): join its gradient sync with zeros
                    steps.zero_backward()
                grad_norm = steps.optimizer_step(optimizer, finite)
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

    def pair_loss(self, batch: UpdateBatch, transition: Transition, reference: Optional[Transition],
                  pairs: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Mean policy loss (+ beta KL, + ``supervised[b, k] * -log p`` where given) over ``pairs [P, 2]`` and its
        diagnostics.

        The pairs are laid out as ``[R, T]`` rows (one per sample of the micro-batch) for ``flowrl.losses``, so a
        sequence-level loss sees each sample's trained steps together; the reduction is the weighted mean over pairs.
        """
        b, k = pairs[:, 0], pairs[:, 1]
        out = transition(pairs)
        samples, row = b.unique(return_inverse=True)
        shape = (len(samples), batch.rollout.num_steps)
        as_rows = lambda x: x.new_zeros(shape).index_put((row, k), x)  # noqa: E731  [P] -> [R, T]
        inputs = {name: as_rows(value) for name, value in self.step_inputs(batch, out, b, k).items()}
        loss, stats = losses.policy_loss(self.loss, as_rows(out.log_prob), as_rows(batch.rollout.log_probs[b, k]),
                                         as_rows(batch.advantages[b, k]),
                                         as_rows(torch.ones_like(b, dtype=torch.bool)), step_inputs=inputs,
                                         **self.loss_options)
        w = batch.weights[b, k]  # [P]
        per_pair = loss[row, k]  # [P]
        metrics = {key: value.item() for key, value in stats.items()}
        if self.beta > 0:
            with torch.no_grad():
                ref = reference(pairs)
            kl = losses.gaussian_mean_kl(out.mean, ref.mean, out.std)  # [P] the exact KL of the two transitions
            if batch.kl_scale is not None:
                kl = kl * batch.kl_scale[b, k]  # in beta's convention
            per_pair = per_pair + self.beta * kl
            metrics["kl"] = kl.mean().item()
        if batch.supervised is not None:
            term = -batch.supervised[b, k] * out.log_prob  # [P]
            per_pair = per_pair + term
            metrics["supervised_loss"] = term.mean().item()
        metrics["loss"] = (per_pair * w).mean().item()
        return (per_pair * w).mean(), metrics

    def step_inputs(self, batch: UpdateBatch, out: Any, b: Tensor, k: Tensor) -> dict[str, Tensor]:
        """The loss's :data:`~flowrl.losses.STEP_INPUTS` ``[P]`` of pairs ``(b, k)`` from their current transition
        ``out``: the mean shift from ``batch.old_means`` (with the gradient of the current mean), the step's std (the
        steps' noise is isotropic), ``dt = sigma_k - sigma_{k+1}``."""
        needs = losses.policy_loss_needs(self.loss)
        inputs = {}
        if "mean_sq_diff" in needs:
            inputs["mean_sq_diff"] = (out.mean.float() - batch.old_means[b, k]).square().flatten(1).mean(1)
        if "std" in needs:
            inputs["std"] = out.std.float().reshape(len(b), -1)[:, 0]
        if "dt" in needs:
            inputs["dt"] = batch.rollout.sigmas[b, k] - batch.rollout.sigmas[b, k + 1]
        return inputs

    @torch.no_grad()
    def on_policy_ratio_deviation(self, batch: UpdateBatch, transition: Transition, reference: Optional[Transition],
                                  epoch: list[list[Tensor]], filler: Optional[Tensor] = None) -> float:
        """max |ratio - 1| over every trained pair with the unchanged weights, in the update's micro-batches ``epoch``
        (the first epoch's, so each pair is recomputed in the same batch composition as its first training pass;
        chunks that are ``filler`` only pad the forward count and are left out). Warns on rank zero above
        ``check_ratio_threshold``."""
        deviation = 0.0
        for micro in epoch:
            for chunk in micro:
                _, stats = self.pair_loss(batch, transition, reference, chunk)
                if chunk is filler:
                    continue
                deviation = max(deviation, stats["ratio_max"] - 1, 1 - stats["ratio_min"])
        if deviation > self.check_ratio_threshold:
            rank_zero_warn(f"check_ratio: max |ratio - 1| = {deviation:.3g} with unchanged weights exceeds "
                           f"check_ratio_threshold={self.check_ratio_threshold:g}; the recomputed log-probs differ "
                           "from the sampled ones (precision, batch-size-dependent kernels or dropout), so clipping "
                           "will fire off-policy. Try autocast null / float32, or a larger clip_range.")
        return deviation

    def recomputed_log_probs(self, rollout: Rollout, transition: Transition, epoch: list[list[Tensor]],
                             filler: Optional[Tensor] = None) -> Tensor:
        """The rollout's log-probs with every trained pair's replaced by its value under the current weights,
        computed in the micro-batches ``epoch`` (the update's first epoch, so each pair in its batch composition;
        chunks that are ``filler`` only pad the forward count and are left out)."""
        return self.replay(rollout, transition, epoch, filler)[0]

    @torch.no_grad()
    def replay(self, rollout: Rollout, transition: Transition, epoch: list[list[Tensor]],
               filler: Optional[Tensor] = None, means: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        """:meth:`recomputed_log_probs`, and (``means``) the trained pairs' transition means ``[B, T, ...]`` float32
        under the current weights (0 elsewhere), from the same forwards."""
        log_probs, old_means = rollout.log_probs.clone(), None
        for micro in epoch:
            for chunk in micro:
                out = transition(chunk)
                if means:  # the filler's too: a rank that trains no pair of its own still computes its loss
                    if old_means is None:
                        old_means = out.mean.new_zeros(*log_probs.shape, *out.mean.shape[1:], dtype=torch.float32)
                    old_means[chunk[:, 0], chunk[:, 1]] = out.mean.float()
                if chunk is not filler:
                    log_probs[chunk[:, 0], chunk[:, 1]] = out.log_prob
        return log_probs, old_means
