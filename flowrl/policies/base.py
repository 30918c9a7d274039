"""The policy adapter contract: what every method needs from a text-to-image model, and nothing more.

A policy encodes prompts once per rollout, gives the velocity for a batch of latents at per-sample sigmas
(classifier-free guidance inside), decodes latents to images in ``[0, 1]``, exposes its trainable parameters
(LoRA through peft, or the full network) and a context in which it acts as the frozen reference model (KL).
Only this package imports diffusers; methods see tensors and :class:`Conditioning`.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor, nn


@dataclass
class Conditioning:
    """Encoded prompts: ``embeds [B, L, D]``, ``pooled [B, P]``; ``null_*`` the unconditional pair (CFG)."""

    embeds: Tensor
    pooled: Tensor
    null_embeds: Optional[Tensor] = None
    null_pooled: Optional[Tensor] = None

    def select(self, index: Tensor | Sequence[int]) -> "Conditioning":
        """The rows ``index`` of every field."""
        index = torch.as_tensor(index, device=self.embeds.device, dtype=torch.long)
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return replace(self, embeds=self.embeds[index], pooled=self.pooled[index],
                       null_embeds=pick(self.null_embeds), null_pooled=pick(self.null_pooled))


@dataclass
class LoraOptions:
    """LoRA through peft. ``target_modules`` None: the adapter's default for its model family."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Optional[list[str]] = None


class FlowPolicy(nn.Module):
    """Base of the adapters: owns the denoiser (``self.denoiser``), LoRA, the reference context and CFG batching.

    Subclasses load their components and implement ``encode``, ``_forward`` (one conditional or unconditional
    evaluation), ``decode``, ``latent_shape`` and ``sigmas``.
    """

    default_lora_targets: tuple[str, ...] = ()
    #: What ``velocity`` returns: ``"velocity"`` (flow matching) or ``"epsilon"`` (a diffusion model's noise
    #: prediction, SD1.5); the step kinds of ``flowrl.sampling.steps.PREDICTIONS`` must read the same.
    prediction: str = "velocity"

    def __init__(self, lora: Optional[LoraOptions] = None):
        super().__init__()
        self.lora = lora
        self.reference_denoiser: Optional[nn.Module] = None

    def _setup_trainable(self, denoiser: nn.Module) -> None:
        """Freeze everything, then add LoRA adapters to ``denoiser`` or unfreeze it whole (full fine-tuning)."""
        self.requires_grad_(False)
        if self.lora is None:
            denoiser.requires_grad_(True)
            return
        from peft import LoraConfig

        targets = self.lora.target_modules or list(self.default_lora_targets)
        config = LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, lora_dropout=self.lora.dropout,
                            init_lora_weights="gaussian", target_modules=targets)
        denoiser.add_adapter(config)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def setup_reference(self) -> None:
        """Make the reference model available: LoRA needs nothing (adapters off); full fine-tuning keeps a frozen
        copy of the initial weights, registered so that checkpoints carry it."""
        if self.lora is None and self.reference_denoiser is None:
            self.reference_denoiser = copy.deepcopy(self.denoiser).requires_grad_(False).eval()

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Within this context the policy evaluates as the reference model (no gradient flows)."""
        if self.lora is not None:
            self.denoiser.disable_adapters()
            try:
                yield
            finally:
                self.denoiser.enable_adapters()
            return
        if self.reference_denoiser is None:
            raise RuntimeError("full fine-tuning needs `setup_reference()` before the reference can be used")
        trained, self.denoiser = self.denoiser, self.reference_denoiser
        try:
            yield
        finally:
            self.denoiser = trained

    def velocity(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0) -> Tensor:
        """Velocity (or noise, see ``prediction``) ``[B, ...]`` at per-sample ``sigma [B]``; with
        ``guidance_scale > 1`` the conditional and the unconditional evaluations run as one batch and combine as
        ``v_u + g (v_c - v_u)``."""
        if guidance_scale == 1.0 or cond.null_embeds is None:
            return self._forward(latents, sigma, cond.embeds, cond.pooled)
        both = self._forward(torch.cat([latents, latents]), torch.cat([sigma, sigma]),
                             torch.cat([cond.null_embeds, cond.embeds]), torch.cat([cond.null_pooled, cond.pooled]))
        v_uncond, v_cond = both.chunk(2)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    def _forward(self, latents: Tensor, sigma: Tensor, embeds: Tensor, pooled: Tensor) -> Tensor:
        raise NotImplementedError

    def encode(self, prompts: list[str]) -> Conditioning:
        raise NotImplementedError

    def decode(self, latents: Tensor) -> Tensor:
        raise NotImplementedError

    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def sigmas(self, num_steps: int) -> Tensor:
        raise NotImplementedError
