"""Policy losses, loss aggregation and KL terms shared by LLM tokens and denoising steps (pure tensor functions).

``policy_loss(name, log_prob, old_log_prob, advantages, mask, **options) -> (loss [B, T], metrics)``, then
``aggregate(loss, mask, mode)``; ``kl(name, log_prob, ref_log_prob)`` for sampled actions and
``gaussian_mean_kl`` for SDE transition kernels; ``entropy_from_logits`` for categorical policies.
"""

from flowrl.losses.aggregate import AGGREGATIONS, aggregate
from flowrl.losses.chunks import chunk_gspo, draw_chunks, relative_l1_changes
from flowrl.losses.entropy import entropy_from_logits
from flowrl.losses.awm import advantage_rescale, awm_loss, flow_matching_log_likelihood, AWM_WEIGHTINGS
from flowrl.losses.kl import KL_CONVENTIONS, KL_ESTIMATORS, gaussian_mean_kl, kl, kl_convention_scale
from flowrl.losses.mean_shift import dppo, grpo_guard
from flowrl.losses.nft import ADVANTAGE_MODES, nft_loss, old_decay, optimality_probability
from flowrl.losses.policy import (STEP_INPUTS, available_policy_losses, check_policy_loss, cispo, gpg, gspo,
                                  is_sequence_level, policy_loss, policy_loss_needs, policy_loss_options,
                                  register_policy_loss, resolve_policy_loss, sapo, vanilla)
from flowrl.losses.tdm import (fake_score_loss, frozen_rows, generator_loss, group_logits, group_preference_loss,
                               renoise, renoise_sigma, surrogate_target)

__all__ = [
    "chunk_gspo", "draw_chunks", "relative_l1_changes",
    "AGGREGATIONS", "KL_CONVENTIONS", "KL_ESTIMATORS", "aggregate", "kl_convention_scale", "available_policy_losses", "check_policy_loss", "cispo",
    "entropy_from_logits", "gaussian_mean_kl", "gpg", "gspo", "is_sequence_level", "kl", "policy_loss",
    "policy_loss_options", "register_policy_loss", "resolve_policy_loss", "sapo", "vanilla",
    # losses that read the step's mean shift (Flow-DPPO, GRPO-Guard)
    "STEP_INPUTS", "dppo", "grpo_guard", "policy_loss_needs",
    # AWM's weighted flow-matching likelihood
    "AWM_WEIGHTINGS", "advantage_rescale", "awm_loss", "flow_matching_log_likelihood",
    # likelihood-free methods: DiffusionNFT (nft) and TDM-R1 (tdm)
    "ADVANTAGE_MODES", "nft_loss", "old_decay", "optimality_probability",
    "fake_score_loss", "frozen_rows", "generator_loss", "group_logits", "group_preference_loss", "renoise",
    "renoise_sigma", "surrogate_target",
]
