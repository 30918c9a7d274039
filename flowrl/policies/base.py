"""The policy adapter contract: what every method needs from a text-to-image model, and nothing more.

A policy encodes prompts once per rollout, gives the velocity for a batch of latents at per-sample sigmas
(classifier-free guidance inside), decodes latents to images in ``[0, 1]``, exposes its trainable parameters
(LoRA through peft, or the full network) and a context in which it acts as the frozen reference model (KL).
Only this package imports diffusers; methods see tensors and :class:`Conditioning`.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import Tensor, nn

from flowrl.policies.conditioning import Conditioning  # noqa: F401  (the adapter contract's type, re-exported)


#: which sides of classifier-free guidance carry the policy gradient (``FlowPolicy.guidance_sides``)
CFG_GRADIENTS = ("both", "cond")

#: the adapter a policy's ``lora`` option creates (peft's and diffusers' default name)
DEFAULT_ADAPTER = "default"


def adapter_of(parameter_name: str) -> Optional[str]:
    """The LoRA adapter a peft parameter belongs to (``...lora_A.<adapter>.weight``), None for other parameters.

    >>> adapter_of("blocks.0.attn.to_q.lora_B.fake_score.weight"), adapter_of("blocks.0.attn.to_q.base_layer.weight")
    ('fake_score', None)
    """
    parts = parameter_name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.startswith("lora_"):
            return parts[i + 1]
    return None


@dataclass
class LoraOptions:
    """LoRA through peft. ``target_modules`` None: the adapter's default for its model family. ``init``: LoRA
    weights the adapter starts from instead of peft's initialisation (a ``save_adapter`` / ``save_lora_weights``
    folder or file, or an embedded ``flowrl/<name>``, e.g. ``flowrl/tiny-digits-k4``, the 4-step distilled model)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Optional[list[str]] = None
    init: Optional[str] = None


class FlowPolicy(nn.Module):
    """Base of the adapters: owns the denoiser (``self.denoiser``), LoRA, the reference context and CFG batching.

    Subclasses load their components and implement ``encode``, ``_forward`` (one conditional or unconditional
    evaluation), ``decode``, ``latent_shape`` and ``sigmas``.
    """

    default_lora_targets: tuple[str, ...] = ()
    #: the denoiser's class, whose block lists FSDP2 shards (:data:`flowrl.policies.sharding.SHARDED_BLOCKS`)
    denoiser_kind: str = ""
    #: What ``velocity`` returns: ``"velocity"`` (flow matching) or ``"epsilon"`` (a diffusion model's noise
    #: prediction, SD1.5); the step kinds of ``flowrl.sampling.steps.PREDICTIONS`` must read the same.
    prediction: str = "velocity"

    def __init__(self, lora: Optional[LoraOptions] = None, activation_offload: bool = False):
        super().__init__()
        self.lora, self.activation_offload = lora, activation_offload
        self.denoiser: Optional[nn.Module] = None  # :meth:`load` sets it
        self.reference_denoiser: Optional[nn.Module] = None
        self.loaded = False
        # the random initialisation (LoRA, a method's extra adapters) draws from the RNG as it was when the policy
        # was built, whenever the weights load: loading under the strategy draws what loading in __init__ drew
        self._init_rng = torch.get_rng_state()

    def load(self) -> "FlowPolicy":
        """Load the weights and set up LoRA or full fine-tuning; once (a later call does nothing). Returns the policy.

        The module calls it in ``configure_model``, under the strategy; a script or a test calls it after building
        the policy. Everything ``__init__`` exposes (``latent_shape()``, ``sigmas()``, the guidance and prediction
        kinds) is known before, from the configs alone."""
        if not self.loaded:
            with self.initialising():
                self._load_weights()
                self._setup_weights()
            self.loaded = True
        return self

    @contextmanager
    def initialising(self) -> Iterator[None]:
        """Within this context the global RNG continues the policy's own initialisation stream (started when the
        policy was built), and tensors are made on the CPU in float32: weights initialised here (LoRA adapters, a
        method's extra adapters) are those that initialising them right after building the policy would give,
        whatever ran in between, and Lightning's ``configure_model`` (run under the strategy's device and the
        precision's default dtype) loads them as a script does; the strategy moves them afterwards."""
        dtype = torch.get_default_dtype()
        torch.set_rng_state(self._init_rng)
        torch.set_default_dtype(torch.float32)
        try:
            with torch.device("cpu"):
                yield
        finally:
            torch.set_default_dtype(dtype)
            self._init_rng = torch.get_rng_state()

    @property
    def lora_targets(self) -> Optional[list[str]]:
        """The modules the LoRA adapter trains (peft's ``target_modules``); None: full fine-tuning trains the whole
        denoiser."""
        return None if self.lora is None else list(self.lora.target_modules or self.default_lora_targets)

    @property
    def sharded_blocks(self) -> tuple[str, ...]:
        """The denoiser's block lists that FSDP2 makes units of (each element of a list, then the denoiser)."""
        from flowrl.policies.sharding import SHARDED_BLOCKS

        return SHARDED_BLOCKS.get(self.denoiser_kind, ())

    def _load_weights(self) -> None:
        """Load every component's weights (``from_pretrained``)."""
        raise NotImplementedError

    def _setup_weights(self) -> None:
        """What follows loading: LoRA or full fine-tuning."""
        self._setup_trainable(self.denoiser)

    def _setup_trainable(self, denoiser: nn.Module) -> None:
        """Freeze everything, then add the LoRA adapter ``default`` to ``denoiser`` or unfreeze it whole (full
        fine-tuning); with ``activation_offload``, the denoiser's forwards keep what they save in host memory
        (:mod:`flowrl.policies.activation_offload`)."""
        if self.activation_offload:
            from flowrl.policies.activation_offload import offload_activations

            self.offload = offload_activations(denoiser)
        self.requires_grad_(False)
        self._trainable_adapters: set[str] = set()
        if self.lora is None:
            denoiser.requires_grad_(True)
            return
        self.add_adapter(DEFAULT_ADAPTER, self.lora)

    # -- named adapters (peft): several LoRA adapters on one backbone ---------------------------------------

    def add_adapter(self, name: str, options: "LoraOptions", trainable: bool = True) -> None:
        """Add the LoRA adapter ``name`` to the denoiser. The active adapter stays the one that was active (the first
        added is active by default); :meth:`adapter` runs the policy under another."""
        from peft import LoraConfig

        if name in self.adapter_names:
            raise ValueError(f"the policy already has an adapter named {name!r}; its adapters: {self.adapter_names}")
        active = self.active_adapter
        targets = options.target_modules or list(self.default_lora_targets)
        config = LoraConfig(r=options.rank, lora_alpha=options.alpha, lora_dropout=options.dropout,
                            init_lora_weights="gaussian", target_modules=targets)
        self.denoiser.add_adapter(config, adapter_name=name)
        if trainable:
            self._trainable_adapters.add(name)
        self._activate(active or name)
        if options.init is not None:
            from flowrl.policies.adapter_weights import load_adapter

            load_adapter(self, name, options.init)

    @property
    def adapter_names(self) -> list[str]:
        """The LoRA adapters on the denoiser, in the order they were added."""
        return list(getattr(self.denoiser, "peft_config", None) or {})

    @property
    def active_adapter(self) -> Optional[str]:
        if not self.adapter_names:
            return None
        active = self.denoiser.active_adapters()
        return active[0] if active else None

    def _activate(self, name: str) -> None:
        """Make ``name`` the adapter the denoiser runs with. peft's ``set_adapter`` (and enabling adapters again)
        also marks only the active adapter trainable: the trainable adapters get their flags back."""
        self.denoiser.set_adapter(name)
        self._restore_trainable()

    def _restore_trainable(self) -> None:
        if not self.adapter_names:
            return
        for pname, param in self.denoiser.named_parameters():
            adapter = adapter_of(pname)
            if adapter is not None:
                param.requires_grad_(adapter in self._trainable_adapters)

    @contextmanager
    def adapter(self, name: str) -> Iterator[None]:
        """Within this context the policy runs with the adapter ``name`` (the others stay loaded and keep their
        weights and trainability)."""
        if name not in self.adapter_names:
            raise ValueError(f"the policy has no adapter {name!r}; its adapters: {self.adapter_names}")
        previous = self.active_adapter
        self._activate(name)
        try:
            yield
        finally:
            self._activate(previous)

    def trainable_parameters(self, adapter: Optional[str] = None) -> list[nn.Parameter]:
        """What an optimizer trains: every parameter that requires a gradient, or only adapter ``adapter``'s (one
        optimizer per trained adapter)."""
        if adapter is None:
            return [p for p in self.parameters() if p.requires_grad]
        if adapter not in self.adapter_names:
            raise ValueError(f"the policy has no adapter {adapter!r}; its adapters: {self.adapter_names}")
        return [p for n, p in self.denoiser.named_parameters() if adapter_of(n) == adapter and p.requires_grad]

    def setup_reference(self) -> None:
        """Make the reference model available: LoRA needs nothing (adapters off); full fine-tuning keeps a frozen
        copy of the initial weights, registered so that checkpoints carry it."""
        if self.lora is None and self.reference_denoiser is None:
            self.reference_denoiser = copy.deepcopy(self.denoiser).requires_grad_(False).eval()

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Within this context the policy evaluates as the reference model, the backbone without any adapter (no
        gradient flows)."""
        if self.lora is not None:
            self.denoiser.disable_adapters()
            try:
                yield
            finally:
                self.denoiser.enable_adapters()
                self._restore_trainable()
            return
        if self.reference_denoiser is None:
            raise RuntimeError("full fine-tuning needs `setup_reference()` before the reference can be used")
        trained, self.denoiser = self.denoiser, self.reference_denoiser
        try:
            yield
        finally:
            self.denoiser = trained

    def velocity(self, latents: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float = 1.0,
                 cfg_gradient: str = "both") -> Tensor:
        """Velocity (or noise, see ``prediction``) ``[B, ...]`` at per-sample ``sigma [B]``; with
        ``guidance_scale > 1`` the unconditional and the conditional evaluations combine through :meth:`guide`
        (their rows computed by :meth:`guidance_sides`, ``cfg_gradient`` saying which carry a gradient)."""
        if guidance_scale == 1.0 or not cond.guided:
            return self._forward(latents, sigma, cond.conditional())
        return self.guide(*self.guidance_sides(latents, sigma, cond, cfg_gradient), guidance_scale)

    def guidance_sides(self, latents: Tensor, sigma: Tensor, cond: Conditioning,
                       cfg_gradient: str = "both") -> tuple[Tensor, Tensor]:
        """``(v_uncond, v_cond)`` of classifier-free guidance. ``both``: the two sides as one batch, the gradient
        through both. ``cond``: the unconditional side first, in a forward of its own without a graph (flow_grpo's
        ``noise_pred_uncond.detach()``, without the backward through it), then the conditional side: the gradient
        of the guided velocity is ``g dv_cond``, and the training pass skips the unconditional half's backward."""
        if cfg_gradient == "cond":
            with torch.no_grad():
                v_uncond = self._forward(latents, sigma, cond.unconditional())
            return v_uncond, self._forward(latents, sigma, cond.conditional())
        both = self._forward(torch.cat([latents, latents]), torch.cat([sigma, sigma]),
                             Conditioning.cat([cond.unconditional(), cond.conditional()]))
        return tuple(both.chunk(2))

    def guide(self, v_uncond: Tensor, v_cond: Tensor, guidance_scale: float) -> Tensor:
        """Classifier-free guidance ``v_u + g (v_c - v_u)`` (a family whose pipeline combines otherwise overrides it).

        >>> FlowPolicy().guide(torch.tensor([1.0]), torch.tensor([3.0]), 2.0)
        tensor([5.])
        """
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    def _forward(self, latents: Tensor, sigma: Tensor, cond: Conditioning) -> Tensor:
        """One evaluation of the denoiser for the rows of one side of ``cond`` (no guidance)."""
        raise NotImplementedError

    #: How the family guides: ``cfg`` (classifier-free guidance on an unconditional side), ``embedded``
    #: (guidance-distilled: ``guidance_scale`` is the denoiser's input, one evaluation) or ``none`` (step-distilled: no
    #: guidance at all); an instance holds its model's, read from its configs when it is built (no weight loads).
    guidance_kind: str = "cfg"

    #: Conditioning images each prompt takes (0: text only; an editing or image-to-video family: its count, or -1
    #: for any number of at least one); the data module and the config checks read it before any weight loads.
    conditioning_images: int = 0

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The conditioning of ``prompts``: per prompt, its encoding and (editing, image-to-video) its ``images``, a
        list of ``[3, H, W]`` tensors in ``[0, 1]`` per prompt (None for a text-only family)."""
        raise NotImplementedError

    def check_images(self, images: Optional[list[list[Tensor]]]) -> None:
        """Refuse conditioning images a family does not take (a text-only policy given them, or none given to an
        editing one)."""
        name = type(self).__name__
        if images is not None and not self.conditioning_images:
            raise ValueError(f"{name} is text-to-image and takes no conditioning images; use an editing or "
                             "image-to-video policy for prompt records with images")
        if images is None and self.conditioning_images:
            raise ValueError(f"{name} conditions on source images: give prompt records with images (a .jsonl file "
                             "with an \"images\" list per prompt)")

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` (videos ``[B, F, 3, H, W]``) in ``[0, 1]`` from sampled latents
        ``[B, *latent_shape]``; ``cond``: those rows' conditioning (row for row), for a family whose decoding reads
        more than the sampled state (LTX-2 image-to-video's clean first latent frame, kept out of the state); the
        others ignore it."""
        raise NotImplementedError

    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def sigmas(self, num_steps: int) -> Tensor:
        raise NotImplementedError

    def solver(self):
        """A fresh copy of the model folder's own scheduler where deterministic sampling (``generate``: validation,
        ``evaluate``, ``predict``) steps with its ``step`` (a multistep solver such as Wan's UniPC, whose state a
        copy keeps per generation), or None where flowrl's ODE step is the pipeline's (Euler, DDIM)."""
        return None
