"""The denoiser of a Wan pipeline: one ``WanTransformer3DModel`` (Wan 2.1, Wan 2.2 TI2V-5B), or Wan 2.2 A14B's two
experts, ``transformer`` for the high-noise steps and ``transformer_2`` for the low-noise ones.

``WanPipeline`` runs ``transformer`` on a step whose scheduler timestep ``t >= boundary_ratio * num_train_timesteps``
and ``transformer_2`` below it. :class:`WanExperts` makes the same choice per row, so a batch whose rows sit at
different steps (a PPO micro-batch of (sample, step) pairs, a tree's frontier and its completions) runs each row
through its own expert, in one module that the policy treats as its ``denoiser``: LoRA adapters, the reference
context, gradient checkpointing and the FSDP2 plan reach both experts through it.

Which experts train is an option (``trained``): LoRA adapters are added to, and full fine-tuning unfreezes, only
those; an untrained expert stays frozen (and costs no optimizer state). Full fine-tuning's KL reference copies only
the trained experts (``reference_experts``); a frozen expert is its own reference, so training one expert of A14B
keeps one 14B copy, not two.

Under FSDP2 each expert's blocks are all-gathered in their forward, a collective: every rank must run the same
experts in the same order. ``collective=True`` runs every expert on every call, an expert with no row of this
batch on a one-row stand-in whose output enters the result times zero (so its backward runs, with zero gradients),
and ranks whose rows fall on different experts still call the same collectives. The same stand-in runs a trained
expert in a training pass whose rows all fall on frozen ones, so that the pass has a backward (of zeros).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

EXPERTS = ("transformer", "transformer_2")


def expert_index(timesteps: Tensor, boundary_timestep: Optional[float]) -> Tensor:
    """Which expert each row's step uses ``[B]`` long: 0 (``transformer``) where ``t >= boundary`` (or without a
    boundary), 1 (``transformer_2``) below it, as ``WanPipeline``.

    >>> expert_index(torch.tensor([999.0, 875.0, 874.9, 0.0]), 875.0).tolist()
    [0, 0, 1, 1]
    """
    if boundary_timestep is None:
        return torch.zeros(timesteps.shape[0], dtype=torch.long, device=timesteps.device)
    return (timesteps < boundary_timestep).long()


class WanExperts(nn.Module):
    """One or two Wan transformers as one denoiser with diffusers' adapter methods (those flowrl's policies call).

    Args:
        transformer: the (high-noise) expert.
        transformer_2: Wan 2.2 A14B's low-noise expert (None: one expert).
        boundary_timestep: ``boundary_ratio * num_train_timesteps`` (None: ``transformer`` on every step).
        trained: the experts that get LoRA adapters (or, without LoRA, train whole).
    """

    def __init__(self, transformer: nn.Module, transformer_2: Optional[nn.Module] = None,
                 boundary_timestep: Optional[float] = None, trained: Sequence[str] = EXPERTS):
        super().__init__()
        if (transformer_2 is None) != (boundary_timestep is None):
            raise ValueError("a second expert needs a boundary timestep (the pipeline's boundary_ratio), and a "
                             "boundary needs a second expert")
        self.transformer, self.transformer_2 = transformer, transformer_2
        self.boundary_timestep = boundary_timestep
        self.trained = tuple(name for name in EXPERTS if name in trained and getattr(self, name) is not None)
        if not self.trained:
            raise ValueError(f"policy.trained_experts={list(trained)} names none of this model's experts "
                             f"{self.names}; choose among them")
        #: full fine-tuning's frozen copies of the trained experts' initial weights, the KL's reference
        self.reference_experts = nn.ModuleDict()
        self._as_reference = False

    @property
    def names(self) -> list[str]:
        """The experts this model has, in the pipeline's order."""
        return [name for name in EXPERTS if getattr(self, name) is not None]

    def experts(self) -> list[nn.Module]:
        return [getattr(self, name) for name in self.names]

    def _with_adapters(self) -> list[nn.Module]:
        return [getattr(self, name) for name in self.trained]

    def _running(self) -> list[nn.Module]:
        """The modules a forward runs, one per expert: inside :meth:`as_reference`, each trained expert's copy."""
        copies = self.reference_experts if self._as_reference else {}
        return [copies[name] if name in copies else getattr(self, name) for name in self.names]

    def setup_reference(self) -> None:
        """Copy the trained experts' current weights, frozen, as the reference (full fine-tuning's KL)."""
        for name in self.trained:
            if name not in self.reference_experts:
                self.reference_experts[name] = copy.deepcopy(getattr(self, name)).requires_grad_(False).eval()

    @contextmanager
    def as_reference(self) -> Iterator[None]:
        """Within this context each trained expert runs as its reference copy, the frozen ones as themselves."""
        if set(self.reference_experts) != set(self.trained):
            raise RuntimeError("full fine-tuning needs `setup_reference()` before the reference can be used")
        self._as_reference = True
        try:
            yield
        finally:
            self._as_reference = False

    @property
    def config(self):
        """The first expert's config (both experts share their shapes)."""
        return self.transformer.config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def expert_index(self, timesteps: Tensor) -> Tensor:
        return expert_index(timesteps, self.boundary_timestep)

    def forward(self, hidden_states: Tensor, timestep: Tensor, encoder_hidden_states: Tensor,
                encoder_hidden_states_image: Optional[Tensor] = None, expert: Optional[Tensor] = None,
                collective: bool = False) -> Tensor:
        """The model output ``[B, C_out, F, h, w]``, each row from its ``expert`` (``[B]`` long; None: the first).

        ``timestep`` is ``[B]`` or, for Wan 2.2 TI2V-5B, ``[B, tokens]``; ``collective`` runs every expert (FSDP2).
        """
        experts = self._running()

        def kwargs(rows, module):  # an expert's inputs in its own dtype (an untrained expert may be bf16)
            image, dtype = encoder_hidden_states_image, module.patch_embedding.weight.dtype  # ModelMixin.dtype: slow
            return dict(hidden_states=hidden_states[rows].to(dtype), timestep=timestep[rows], return_dict=False,
                        encoder_hidden_states=encoder_hidden_states[rows].to(dtype),
                        encoder_hidden_states_image=None if image is None else image[rows].to(dtype))

        if len(experts) == 1:
            return experts[0](**kwargs(slice(None), experts[0]))[0]
        expert = torch.zeros(len(hidden_states), dtype=torch.long, device=hidden_states.device) if expert is None \
            else expert.to(hidden_states.device)
        rows_of = [(expert == index).nonzero().flatten() for index in range(len(experts))]
        # a training pass whose rows all fall on frozen experts: the trained expert's stand-in gives its loss a graph
        # (zero gradients, as such rows get in any micro-batch), so that its backward runs as every other one
        orphan = torch.is_grad_enabled() and not self._as_reference and not any(
            len(rows) for rows, name in zip(rows_of, self.names) if name in self.trained)
        out, unused = None, None
        for index, (module, rows) in enumerate(zip(experts, rows_of)):
            if len(rows) == 0:
                # a one-row stand-in: under FSDP2 this rank calls the expert's collectives like the others
                if collective or (orphan and self.names[index] in self.trained):
                    stand_in = module(**kwargs(slice(0, 1), module))[0].float().sum() * 0
                    unused = stand_in if unused is None else unused + stand_in
                continue
            y = module(**kwargs(rows, module))[0].float()
            out = y.new_zeros((len(hidden_states), *y.shape[1:])) if out is None else out
            out = out.index_copy(0, rows, y)
        return out if unused is None else out + unused

    # -- diffusers' adapter methods, on the trained experts ----------------------------------------------------

    def add_adapter(self, adapter_config, adapter_name: str = "default") -> None:
        for module in self._with_adapters():
            module.add_adapter(copy.deepcopy(adapter_config), adapter_name=adapter_name)

    @property
    def peft_config(self) -> dict:
        return getattr(self._with_adapters()[0], "peft_config", None) or {}

    def active_adapters(self) -> list[str]:
        return self._with_adapters()[0].active_adapters()

    def set_adapter(self, adapter_name) -> None:
        for module in self._with_adapters():
            module.set_adapter(adapter_name)

    def disable_adapters(self) -> None:
        for module in self._with_adapters():
            module.disable_adapters()

    def enable_adapters(self) -> None:
        for module in self._with_adapters():
            module.enable_adapters()

    def fuse_lora(self, adapter_names: Optional[list[str]] = None) -> None:
        for module in self._with_adapters():
            module.fuse_lora(adapter_names=adapter_names)

    def unload_lora(self) -> None:
        for module in self._with_adapters():
            module.unload_lora()

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each block's activations in the backward pass, in every expert."""
        for module in self.experts():
            module.enable_gradient_checkpointing()
