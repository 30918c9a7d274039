"""A policy on the components of a diffusers text-to-image pipeline (SD3/3.5, FLUX.1).

What every pipeline-backed adapter shares: component loading with ``from_pretrained(path, subfolder=...)``,
the pipeline's own ``encode_prompt`` (called on a pipeline object that only references the policy's modules),
a per-prompt cache of the encodings, mixed precision (frozen weights in ``torch_dtype``, trainable weights in
float32, the network under ``torch.autocast``; the sampler maths stays float32 because velocities leave the
adapter as float32), chunked VAE decoding, gradient checkpointing, and checkpoints that hold only the trained
weights (the frozen ones reload from the model path).
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from typing import Callable, ClassVar, Hashable, Iterable, Iterator, Optional, Sequence

import torch
from diffusers.image_processor import VaeImageProcessor
from torch import Tensor

from flowrl.policies.base import Conditioning, FlowPolicy, LoraOptions, adapter_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def precision_problems(torch_dtype: str, autocast: Optional[str], vae_chunk_size: Optional[int],
                       prompt_cache_size: int) -> list[str]:
    """Problems with the precision and memory options, each naming the key and the fix.

    >>> precision_problems("bf16", None, 0, 8)  # doctest: +NORMALIZE_WHITESPACE
    ["policy.torch_dtype='bf16': choose one of ['bfloat16', 'float16', 'float32']",
     'policy.vae_chunk_size=0 must be >= 1 (or null: decode the whole batch at once)']
    """
    problems = []
    if torch_dtype not in DTYPES:
        problems.append(f"policy.torch_dtype={torch_dtype!r}: choose one of {sorted(DTYPES)}")
    if autocast is not None and autocast not in ("bfloat16", "float16"):
        problems.append(f"policy.autocast={autocast!r}: choose bfloat16, float16 or null (no autocast)")
    if vae_chunk_size is not None and vae_chunk_size < 1:
        problems.append(f"policy.vae_chunk_size={vae_chunk_size} must be >= 1 (or null: decode the whole batch at "
                        "once)")
    if prompt_cache_size < 0:
        problems.append(f"policy.prompt_cache_size={prompt_cache_size} must be >= 0 (0 disables the cache)")
    return problems


class PolicyOptionsError(ValueError):
    """The problems of a policy's options, all of them (``problems``), one line each."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid policy settings:\n  " + "\n  ".join(self.problems))


@contextmanager
def joined_problems(problems: list[str]) -> Iterator[None]:
    """Around a subclass's ``super().__init__(...)``: the parent's problems and the subclass's ``problems`` raised
    together (the subclass checks its own options before the parent's ``__init__`` runs)."""
    try:
        yield
    except PolicyOptionsError as err:
        raise PolicyOptionsError([*err.problems, *problems]) from None
    if problems:
        raise PolicyOptionsError(problems)


class PromptCache:
    """Least-recently-used cache of per-prompt encodings (a tuple of unbatched tensors per prompt).

    >>> cache = PromptCache(2); cache.put("a", (torch.zeros(1),)); cache.put("b", (torch.ones(1),))
    >>> _ = cache.get("a"); cache.put("c", (torch.ones(1),)); sorted(cache.entries)
    ['a', 'c']
    """

    def __init__(self, size: int):
        self.size = size
        self.entries: OrderedDict[str, tuple[Tensor, ...]] = OrderedDict()

    def get(self, prompt: str) -> Optional[tuple[Tensor, ...]]:
        if prompt in self.entries:
            self.entries.move_to_end(prompt)
        return self.entries.get(prompt)

    def put(self, prompt: str, value: tuple[Tensor, ...]) -> None:
        if self.size == 0:
            return
        self.entries[prompt] = value
        self.entries.move_to_end(prompt)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def lookup(self, keys: Sequence[Hashable], encode: Callable[[list], Iterable[tuple[Tensor, ...]]]) -> dict:
        """Each distinct key's value: the cached ones, then the missing ones from one ``encode(missing)`` call
        (missing keys in order of first appearance, one value each), cached.

        >>> calls = []; cache = PromptCache(4)
        >>> found = cache.lookup(["a", "b", "a"], lambda keys: calls.append(keys) or [(torch.ones(1),)] * len(keys))
        >>> _ = cache.lookup(["b", "c"], lambda keys: calls.append(keys) or [(torch.ones(1),)] * len(keys)); calls
        [['a', 'b'], ['c']]
        """
        found = {key: self.get(key) for key in dict.fromkeys(keys)}
        missing = [key for key, value in found.items() if value is None]
        if missing:
            for key, value in zip(missing, encode(missing), strict=True):
                found[key] = value
                self.put(key, value)
        return found


class PipelinePolicy(FlowPolicy):
    """Base of the pipeline-backed adapters. Subclasses read their configs in ``__init__`` (``vae_config``,
    ``denoiser_config``) and end it with ``check_problems``, load their components in ``_load_weights``, and
    implement ``components`` (the pipeline's constructor arguments), ``_encode_batch``, ``_forward``,
    ``latent_shape`` and ``sigmas``.

    Args:
        lora: LoRA options (None: full fine-tuning, whose trained weights are float32 whatever ``torch_dtype``).
        torch_dtype: dtype of the frozen weights (text encoders, VAE, the base transformer under LoRA).
        autocast: run the networks under ``torch.autocast`` in this dtype (None: no autocast).
        gradient_checkpointing: recompute the transformer's activations in the backward pass.
        vae_chunk_size: decode at most this many latents at once (None: the whole batch).
        prompt_cache_size: encodings kept per prompt (LRU); 0 disables the cache.
        activation_offload: keep what the transformer's training forward saves for its backward in pinned host
            memory, copied back in the backward (``torch.autograd.graph.save_on_cpu``, the weights left in place):
            activation memory off the accelerator for two host-link copies of it per pass.
    """

    pipeline_class: ClassVar[type]

    def __init__(self, lora: Optional[LoraOptions], torch_dtype: str = "float32", autocast: Optional[str] = None,
                 gradient_checkpointing: bool = False, vae_chunk_size: Optional[int] = None,
                 prompt_cache_size: int = 1024, activation_offload: bool = False):
        super().__init__(lora=lora, activation_offload=activation_offload)
        # raised with the family's own problems by check_problems, at the end of the family's __init__
        self.option_problems = precision_problems(torch_dtype, autocast, vae_chunk_size, prompt_cache_size)
        self.torch_dtype = DTYPES.get(torch_dtype, torch.float32)
        self.autocast_dtype = DTYPES.get(autocast) if autocast else None
        self.gradient_checkpointing, self.vae_chunk_size = gradient_checkpointing, vae_chunk_size
        self.prompt_cache = PromptCache(prompt_cache_size)

    @property
    def denoiser_dtype(self) -> torch.dtype:
        """The dtype the transformer's frozen weights are in (full fine-tuning trains float32 weights)."""
        return self.torch_dtype if self.lora is not None else torch.float32

    def check_problems(self, problems: list[str] = ()) -> None:
        """Raise every problem of the options (the precision options' and the family's ``problems``) together.

        Raises:
            ValueError: one line per problem, each naming the key and the fix.
        """
        if found := [*self.option_problems, *problems]:
            raise PolicyOptionsError(found)

    def _setup_weights(self) -> None:
        """LoRA or full fine-tuning, float32 trainable weights, checkpointing, and checkpoints of trained weights."""
        self._setup_trainable(self.denoiser)
        for p in self.trainable_parameters():
            p.data = p.data.float()  # optimizer states and updates in float32, as diffusers' cast_training_params
        if self.gradient_checkpointing:
            self.denoiser.enable_gradient_checkpointing()
        self._register_state_dict_hook(_drop_frozen)
        self.register_load_state_dict_post_hook(_allow_missing_frozen)

    # -- the pipeline and its encodings ------------------------------------------------------------------------

    def components(self) -> dict:
        """The pipeline's constructor arguments (the policy's own modules, not copies)."""
        raise NotImplementedError

    def pipeline(self):
        """A diffusers pipeline that references this policy's modules (cheap: nothing is copied)."""
        return self.pipeline_class(**self.components())

    def _encode_batch(self, prompts: list[str]) -> tuple[Tensor, ...]:
        """The encodings of distinct prompts, from the pipeline's ``encode_prompt``: ``(embeds [n, L, D], pooled
        [n, P])`` (``(embeds,)`` for a family without a pooled embedding)."""
        raise NotImplementedError

    @torch.no_grad()
    def _encoded(self, prompts: list[str]) -> tuple[Tensor, ...]:
        """Encodings of ``prompts`` (repeats allowed), each distinct prompt encoded once and then cached."""
        found = self.prompt_cache.lookup(prompts, lambda missing: zip(*self._encode_batch(missing)))
        return stacked([found[p] for p in prompts], self.denoiser.device)

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts and, for classifier-free guidance, the empty prompt (diffusers' default negative prompt)."""
        self.check_images(images)
        embeds, pooled = self._encoded(list(prompts))
        null_embeds, null_pooled = self._encoded([""] * len(prompts))
        return Conditioning(embeds, pooled, null_embeds, null_pooled)

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.denoiser.device.type, dtype=self.autocast_dtype)

    # -- images ------------------------------------------------------------------------------------------------

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae_config["block_out_channels"]) - 1)

    def decode(self, latents: Tensor, cond: Optional[Conditioning] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[0, 1]`` from latents ``[B, C, h, w]``, ``vae_chunk_size`` at a time."""
        cfg = self.vae.config
        return self.decode_chunks(latents, lambda z: z.to(self.vae.dtype) / cfg.scaling_factor +
                                  (cfg.shift_factor or 0.0))

    def decode_chunks(self, latents: Tensor, vae_input: Callable[[Tensor], Tensor], autocast: bool = True) -> Tensor:
        """The decode path of every family, images and videos: ``vae_chunk_size`` latents at a time, each chunk
        mapped to the VAE's input by ``vae_input`` (the family's un-normalisation), decoded (under ``autocast``, the
        policy's setting), and the VAE's ``[-1, 1]`` output mapped to ``[0, 1]`` by the pipelines'
        ``VaeImageProcessor.denormalize``. Returns the VAE's layout (``[B, 3, H, W]``; ``[B, 3, F, H, W]`` for a
        video VAE), float32."""
        outputs = []
        for chunk in latents.split(self.vae_chunk_size or len(latents)):
            z = vae_input(chunk)
            with self._autocast() if autocast else nullcontext():
                outputs.append(self.vae.decode(z, return_dict=False)[0].float())
        return VaeImageProcessor.denormalize(torch.cat(outputs))


def stacked(rows: Sequence[tuple[Tensor, ...]], device: torch.device) -> tuple[Tensor, ...]:
    """Per-row encodings (each a tuple of unbatched tensors, the same width) stacked into batched tensors on
    ``device``.

    >>> [t.shape for t in stacked([(torch.ones(2), torch.ones(3))] * 4, torch.device("cpu"))]
    [torch.Size([4, 2]), torch.Size([4, 3])]
    """
    return tuple(torch.stack(part).to(device) for part in zip(*rows))


def _trained_names(policy: PipelinePolicy) -> set[str]:
    # every LoRA adapter's weights, trained or frozen (a method's frozen copy, e.g. DiffusionNFT's old policy): they
    # do not come from the model path
    return {name for name, p in policy.named_parameters() if p.requires_grad or adapter_of(name) is not None}


def _drop_frozen(module: PipelinePolicy, state_dict: dict, prefix: str, local_metadata) -> None:
    """Checkpoints keep the trained weights only: the frozen ones (and the reference copy) reload from the model."""
    keep = {prefix + name for name in _trained_names(module)}
    for key in [k for k in state_dict if k.startswith(prefix) and k not in keep]:
        del state_dict[key]


def _allow_missing_frozen(module: PipelinePolicy, incompatible) -> None:
    """Loading such a checkpoint: frozen weights are not missing (they came from the model path)."""
    trained = _trained_names(module)
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    frozen = {name for name, _ in named} - trained  # every name of a tied weight (T5's embed_tokens is shared)

    def is_frozen(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[i:]) in frozen for i in range(len(parts)))

    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not is_frozen(k)]
