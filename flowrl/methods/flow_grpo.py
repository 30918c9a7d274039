"""Flow-GRPO (arXiv 2505.05470): GRPO on the flow SDE, one outcome reward per trajectory.

The shared loop is the whole algorithm: SDE sampling on every step, group advantages (``grpo@flow_grpo``:
population std of the gathered batch, +1e-4, clip 5) broadcast to every trained step, PPO clip 1e-4, optional KL.
Its one hook: the trained steps are the stochastic steps among the first ``floor(T * timestep_fraction)``. As the
authors' ``scripts/train_sd3.py`` (``compute_log_prob``), the unconditional half of the guided velocity is detached
(``cfg_gradient: cond``) and the KL is divided by the SDE's ``s^2`` (``kl_convention: flow_grpo``), so their
published ``beta`` values (0.01 PickScore, 0.04 GenEval and OCR) transfer unchanged.

Two step-credit methods are options of it, since they change only which steps are stochastic, how noisy, and how
much each counts (the ODE runs on the other steps, and only stochastic steps are trained):

- MixGRPO (arXiv 2507.21802): ``sde_window = S``: the SDE on a window of ``S`` steps that slides over training
  (:func:`flowrl.sampling.windows.window_mask`: ``progressive`` every ``window_shift_every`` batches, or ``random``,
  inside ``window_range``, default ``[0, T - 2)`` as the authors'); MixGRPO-Flash: ``ode_solver_after_window:
  dpmsolver++``, diffusers' DPM-Solver++ (order 2) on the steps after the window instead of Euler
  (:mod:`flowrl.sampling.multistep`), and ``tail_compress``, those steps on a coarser sub-grid
  (:mod:`flowrl.sampling.coarse_tail`).
- Flash-GRPO (arXiv 2605.15980): ``flash_pool``: one stochastic step per prompt group drawn from these steps;
  ``flash_noise``: its std ``noise_level * (sigma_min + (sigma_max - sigma_min) sigma)``; ``rectify``: the loss
  weight ``coe / mean coe`` over the ``batch`` (the authors) or the ``pool`` (UniRL)
  (:mod:`flowrl.sampling.flash`).

GCPO / Chunk-GRPO (arXiv 2510.21583) is a loss preset, ``loss: chunk_gspo@gcpo`` (:mod:`flowrl.losses.chunks`), with
``train_chunks``: the share of the loss's chunks trained per sample, drawn per sample (uniformly, or weighted by
each chunk's relative-L1 latent change with ``chunk_weighting``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl import losses
from flowrl.losses.chunks import CHUNK_WEIGHTINGS, draw_chunks, relative_l1_changes
from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least
from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.policies.multistep_solvers import MULTISTEP_SOLVERS, multistep_solver
from flowrl.sampling.coarse_tail import coarse_grid, last_stochastic_step
from flowrl.sampling.flash import WEIGHT_SCOPES, flash_noise_levels, group_steps, one_step_mask, rectification
from flowrl.sampling.flash import rectified_weights
from flowrl.sampling.multistep import MultistepTail
from flowrl.sampling.rollout import Rollout
from flowrl.sampling.sampler import fraction_problems, trained_steps
from flowrl.sampling.windows import WINDOW_STRATEGIES, window_mask


class FlowGRPO(PolicyGradient):
    """Flow-GRPO. Options beyond the loop's (:class:`~flowrl.methods.policy_gradient.PolicyGradient`):

    Args:
        timestep_fraction: train the stochastic steps among the first ``floor(T * timestep_fraction)``.
        cfg_gradient: ``cond``: the unconditional half detached, as flow_grpo's ``compute_log_prob``; ``both``: the
            exact gradient of the guided velocity (DDPO's ``scripts/train.py``).
        kl_convention: ``flow_grpo``: ``beta`` in flow_grpo's units (its KL over ``2 s^2``); ``exact``: the
            Gaussian KL of the two transitions.
        sde_window: MixGRPO: the SDE (and training) on a window of this many steps, the ODE elsewhere (None: the
            SDE on every step).
        window_strategy: ``progressive`` (the window moves one step every ``window_shift_every`` batches, back to
            the start past the range) or ``random`` (a start drawn each batch from the run's seed).
        window_shift_every: batches per window position (MixGRPO's ``iters_per_group``, 25).
        window_range: ``[low, high)``: the steps the window may cover (None: ``[0, T - 2)``, MixGRPO's).
        ode_solver_after_window: MixGRPO-Flash: the steps after the window integrated by this diffusers multistep
            solver (``dpmsolver++``: DPM-Solver++ of order 2, the authors') (None: the ODE step).
        tail_compress: MixGRPO-Flash's ``dpm_post_compress_ratio`` (the authors' 0.4): after the window's last step
            ``L`` the ODE runs on ``min(max(int((T - L) x tail_compress) - 1, 1), T - L - 1)`` steps instead of the
            grid's ``T - L - 1`` (the authors' ``int(max((T - L) x ratio, 1)) - 1``, but at least one step), on
            the schedule's own points at rounded evenly spaced indices from ``L + 1`` to ``T`` (the authors
            re-space in time and re-apply the shift: the same points where the spacing is whole); the skipped
            states are interpolated in sigma (the Euler path), and only the model calls made are counted.
            Saves model calls after the window only; the window's steps are unchanged (1: the grid's steps).
        flash_pool: Flash-GRPO: the steps from which each prompt group draws its one stochastic step (None: off).
        flash_noise: Flash-GRPO's SDE std ``noise_level * (sigma_min + (sigma_max - sigma_min) sigma)``.
        rectify: Flash-GRPO's loss weight ``coe(k) / mean coe``: ``batch`` (the authors) or ``pool`` (UniRL)
            (None: 1).
        train_chunks: GCPO: train ``int(chunks x train_chunks)`` of the ``chunk_gspo`` loss's chunks per sample
            (None: all of them; the authors' 0.5).
        chunk_weighting: GCPO's weighted chunk draw, ``normalized`` or ``softmax`` of the chunks' mean relative-L1
            latent change (None: uniform).
    """

    def __init__(self, policy: FlowPolicy, timestep_fraction: float = 0.99, cfg_gradient: str = "cond",
                 kl_convention: str = "flow_grpo", sde_window: Optional[int] = None,
                 window_strategy: str = "progressive", window_shift_every: int = 25,
                 window_range: Optional[list[int]] = None, ode_solver_after_window: Optional[str] = None,
                 tail_compress: float = 1.0, flash_pool: Optional[list[int]] = None,
                 flash_noise: bool = False, rectify: Optional[str] = None, train_chunks: Optional[float] = None,
                 chunk_weighting: Optional[str] = None, **kwargs: Any):
        super().__init__(policy, cfg_gradient=cfg_gradient, kl_convention=kl_convention, **kwargs)
        self.timestep_fraction = timestep_fraction
        self.sde_window, self.window_strategy = sde_window, window_strategy
        self.window_shift_every, self.window_range = window_shift_every, window_range
        self.ode_solver_after_window, self.tail_compress = ode_solver_after_window, tail_compress
        self.flash_pool, self.flash_noise, self.rectify = flash_pool, flash_noise, rectify
        self.train_chunks, self.chunk_weighting = train_chunks, chunk_weighting

    def problems(self) -> list[str]:
        problems = super().problems() + fraction_problems(self.timestep_fraction)
        problems += at_least(self, 1, ("sde_window",), hint=" (or null)") + at_least(self, 1, ("window_shift_every",))
        T, strategy, pool = self.num_steps, self.window_strategy, self.flash_pool
        if strategy not in WINDOW_STRATEGIES:
            problems.append(f"model.window_strategy={strategy!r}: choose one of {list(WINDOW_STRATEGIES)}")
        low, high = self.window_range or (0, T - 2)
        if self.sde_window is not None and not 0 <= low < high <= T:
            problems.append(f"model.window_range=[{low}, {high}) must lie in the {T} steps with low < high")
        if pool is not None and not (pool and all(0 <= k < T for k in pool)):
            problems.append(f"model.flash_pool={pool} must list steps in [0, {T})")
        if self.flash_pool is not None and self.sde_window is not None:
            problems.append("model.flash_pool and model.sde_window both choose the stochastic steps: set one")
        if self.rectify is not None and (self.rectify not in WEIGHT_SCOPES or self.flash_pool is None):
            problems.append(f"model.rectify={self.rectify!r}: choose one of {list(WEIGHT_SCOPES)} with a flash_pool "
                            "(or null)")
        return problems + chunk_problems(self) + tail_problems(self)

    def sde_mask(self, batch: int = 0) -> Tensor:
        """The window at ``batch`` (MixGRPO), every pool step (Flash-GRPO: some group draws each), or every step."""
        if self.sde_window is not None:
            low, high = self.window_range or (0, self.num_steps - 2)
            return window_mask(batch, num_steps=self.num_steps, size=self.sde_window,
                               strategy=self.window_strategy, every=self.window_shift_every, low=low, high=high,
                               seed=self.seed)
        if self.flash_pool is not None:
            return torch.isin(torch.arange(self.num_steps), torch.tensor(self.flash_pool))
        return super().sde_mask()

    def rollout_sde_mask(self, batch: dict) -> Tensor:
        if self.flash_pool is not None:
            steps = group_steps(batch["group_ids"], self.flash_pool, self.seed, self.batches_done())
            return one_step_mask(steps.cpu(), self.num_steps)
        return self.sde_mask(self.batches_done())

    def rollout(self, batch: dict, cond: Conditioning) -> Rollout:
        rollout = super().rollout(batch, cond)
        if self.train_chunks is not None:  # each sample's draw from its own seed: the same on any rank
            chunks, T = self.ppo.loss_options["chunks"], self.num_steps
            weights = None if self.chunk_weighting is None else relative_l1_changes(rollout.latents)
            batch_seed = (self.seed * 1_000_003 + self.batches_done()) * 1_000_003
            drawn = [draw_chunks(chunks, T, 1, self.train_chunks, torch.Generator().manual_seed(batch_seed + s),
                                 None if weights is None else weights[i:i + 1].cpu(), self.chunk_weighting or
                                 "normalized") for i, s in enumerate(rollout.seeds.tolist())]
            rollout.train_mask &= torch.cat(drawn).to(rollout.train_mask.device)
        return rollout

    def ode_tail(self, sde_mask: Tensor, sigmas: Tensor) -> Optional[MultistepTail]:
        if self.ode_solver_after_window is None:
            return None
        after = last_stochastic_step(sde_mask) + 1  # after every row's window
        return MultistepTail(multistep_solver(self.ode_solver_after_window), sigmas, after)

    def rollout_grid(self, sde_mask: Tensor) -> Optional[Tensor]:
        return None if self.sde_window is None else coarse_grid(sde_mask, self.tail_compress)

    def rollout_cost(self) -> tuple[int, int]:
        """One trajectory; with ``tail_compress`` its model calls at the first batch's window (later windows cost
        what theirs do: ``rollout/evaluations`` counts them)."""
        grid = self.rollout_grid(self.sde_mask(0)) if self.tail_compress < 1 else None
        return (1, self.num_steps) if grid is None else (1, len(grid) - 1)

    def noise_levels(self) -> Tensor:
        if not self.flash_noise:
            return super().noise_levels()
        return self.noise_level * flash_noise_levels(self.policy.sigmas(self.num_steps).float().cpu())

    def loss_weights(self, batch: Batch) -> Tensor:
        if self.rectify is None:
            return super().loss_weights(batch)
        coe = rectification(self.policy.sigmas(self.num_steps).float().cpu()).to(batch.log_probs)
        steps = batch.train_mask.float().argmax(1)  # each row's one trained step
        weights = rectified_weights(steps[batch.valid], coe, self.rectify, self.flash_pool)
        out = torch.zeros_like(batch.log_probs)
        out[batch.valid] = weights[:, None].expand(-1, out.shape[1])
        return out

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        return trained_steps(sde_mask, self.timestep_fraction, sigmas, self.step_kind)


def tail_problems(o: "FlowGRPO") -> list[str]:
    """MixGRPO-Flash's solver: a known one, after a window, on a flow (velocity) model; its compression: in (0, 1],
    after a window, without completions (they start at every state); Flash-GRPO's noise: the ``flow_grpo`` step's."""
    problems, solver = [], o.ode_solver_after_window
    if solver is not None:
        if solver not in MULTISTEP_SOLVERS:
            problems.append(f"model.ode_solver_after_window={solver!r}: choose one of {list(MULTISTEP_SOLVERS)} "
                            "(or null)")
        if o.sde_window is None:
            problems.append("model.ode_solver_after_window solves the steps after MixGRPO's window: set "
                            "model.sde_window (or null)")
        if (predicts := getattr(o.policy, "prediction", "velocity")) != "velocity":
            problems.append(f"model.ode_solver_after_window={solver!r} is the flow (velocity) solver, but the policy "
                            f"predicts {predicts}; set it to null")
    if not 0 < o.tail_compress <= 1:  # also rejects NaN
        problems.append(f"model.tail_compress={o.tail_compress} must be in (0, 1]: the share of the steps after the "
                        "window kept (1: all of them; MixGRPO-Flash's 0.4)")
    elif o.tail_compress < 1 and o.sde_window is None:
        problems.append(f"model.tail_compress={o.tail_compress} compresses the ODE steps after MixGRPO's window: set "
                        "model.sde_window, or model.tail_compress=1")
    elif o.tail_compress < 1 and o.completions is not None:
        problems.append(f"model.tail_compress={o.tail_compress} skips states whose completions "
                        f"{type(o).__name__} scores: set model.tail_compress=1")
    if o.flash_noise and o.step_kind != "flow_grpo":
        problems.append(f"model.flash_noise=true sets the flow_grpo step's std, not the {o.step_kind} step's; set "
                        "model.step_kind=flow_grpo or model.flash_noise=false")
    return problems


def chunk_problems(o: "FlowGRPO") -> list[str]:
    """GCPO's chunk draw needs the ``chunk_gspo`` loss with a chunk list, a share in (0, 1] and a known weighting."""
    if o.train_chunks is None:
        return [] if o.chunk_weighting is None else ["model.chunk_weighting needs model.train_chunks (or null)"]
    problems = []
    try:
        base, options = losses.resolve_policy_loss(o.loss, **(o.loss_options or {}))
    except ValueError:  # the loop's check names it
        base, options = o.loss, {}
    if base != "chunk_gspo" or not options.get("chunks"):
        problems.append(f"model.train_chunks={o.train_chunks} draws the chunks of the chunk_gspo loss: set "
                        "model.loss=chunk_gspo@gcpo (or chunk_gspo with loss_options.chunks)")
    elif int(len(options["chunks"]) * o.train_chunks) < 1:
        problems.append(f"model.train_chunks={o.train_chunks} trains int({len(options['chunks'])} x "
                        f"{o.train_chunks}) = 0 chunks; raise it")
    if not 0 < o.train_chunks <= 1:
        problems.append(f"model.train_chunks={o.train_chunks} must be in (0, 1]")
    if o.chunk_weighting is not None and o.chunk_weighting not in CHUNK_WEIGHTINGS:
        problems.append(f"model.chunk_weighting={o.chunk_weighting!r}: choose one of {list(CHUNK_WEIGHTINGS)}")
    return problems
