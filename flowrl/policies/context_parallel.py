"""A denoiser whose clip's tokens are split over a group of processes: diffusers' own context parallelism.

A denoiser class with a ``_cp_plan`` (``WanTransformer3DModel``'s: split the patch tokens before the first block and
the rotary embedding's output along the sequence, gather the sequence after ``proj_out``; the text is not split)
runs under ``ModelMixin.enable_parallelism(config=ContextParallelConfig(...))``: each process of a context-parallel
group holds ``tokens / degree`` of the sequence through every block, and attention, the one place where tokens meet,
exchanges them inside diffusers' templated attention (``diffusers.models.attention_dispatch``):

- **Ulysses** (``ulysses_degree``): an all-to-all turns the sequence split into a head split before attention and
  back after it (``TemplatedUlyssesAttention``). It runs on diffusers' ``native`` backend (torch's
  ``scaled_dot_product_attention``), so on CPU processes over gloo too, which is how the tests check it. The heads
  must divide by the degree.
- **Ring** (``ring_degree``): every process keeps its queries and meets the others' keys and values one chunk at a
  time, merging partial results through their log-sum-exp (``TemplatedRingAttention``). The native backend returns
  no log-sum-exp (``ValueError: Native attention does not support return_lse=True``), so ring attention needs a GPU
  backend (:data:`RING_BACKENDS`); its test is ``gpu``-marked.

The output is gathered whole on every process of the group, so the velocity and the log-probabilities are those of
one process; the gather's backward keeps each process's slice of the gradient, so the whole gradient is the sum over
the group (the strategy's reduction makes it: :mod:`flowrl.strategies.context_parallel`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch import nn

ATTENTIONS = ("ulysses", "ring")
#: diffusers' attention backends that can run ring attention (they return the log-sum-exp); all need a GPU
RING_BACKENDS = ("flash", "_native_cudnn", "_native_flash", "sage")
#: the policies whose split sequence flowrl knows before loading (``denoiser_kind``, :func:`split_sequence`); a
#: family with a diffusers ``_cp_plan`` but no entry here is refused, not guessed
SEQUENCES = ("WanExperts",)
#: denoisers that have a ``_cp_plan`` in diffusers 0.42.1 and that flowrl still refuses to split, with the reason
UNSPLIT = {
    "LTX2VideoTransformer3DModel": "its plan splits the video tokens and the prompt but not the audio stream, whose "
                                   "attentions diffusers then runs under the same context-parallel config on whole, "
                                   "unsplit sequences (every attention processor gets the config); no 2-process "
                                   "equality with one process is established for the joint audio-video model",
}


def split_sequence(policy: Any) -> tuple[int, int]:
    """``(tokens, heads)`` of the sequence ``policy``'s denoiser splits under context parallelism, from its configs:
    Wan's patch tokens (latent frames x patch rows x patch columns; the text is not split) and attention heads.

    >>> from types import SimpleNamespace
    >>> wan = SimpleNamespace(latent_shape=lambda: (16, 21, 60, 104),
    ...                       denoiser_config={"patch_size": (1, 2, 2), "num_attention_heads": 12})
    >>> split_sequence(wan)  # Wan 2.1 1.3B, 81 frames at 480 x 832: 21 x 30 x 52
    (32760, 12)
    """
    config = policy.denoiser_config
    _, frames, height, width = policy.latent_shape()
    p_t, p_h, p_w = config["patch_size"]
    return (frames // p_t) * (height // p_h) * (width // p_w), int(config["num_attention_heads"])


def context_parallel_problems(policy: Any, degree: int, attention: str, world: Optional[int],
                              key: str = "trainer.strategy.") -> list[str]:
    """Why ``policy`` (built, not loaded) cannot split its clip over ``degree`` processes with ``attention`` among
    ``world`` processes (None: not known yet), each naming the option and a fix; empty when it can. A stand-in for a
    policy that could not be built (its folder missing) is checked by its family alone (``denoiser_kind``)."""
    if degree == 1:
        return []
    problems = []
    if attention not in ATTENTIONS:
        problems.append(f"{key}context_parallel_attention={attention!r}: choose among {list(ATTENTIONS)}")
    if degree < 1:
        return problems + [f"{key}context_parallel_size={degree} must be >= 1 (1: no context parallelism)"]
    if world is not None and world % degree:
        problems.append(f"{key}context_parallel_size={degree} does not divide the {world} processes; set it to a "
                        f"divisor of {world} (each group of {degree} processes splits one clip)")
    kind, cls = getattr(policy, "denoiser_kind", ""), _denoiser_class(policy)
    if cls is None or getattr(cls, "_cp_plan", None) is None:
        return problems + [f"{key}context_parallel_size={degree}: {type(policy).__name__}'s denoiser "
                           f"({cls.__name__ if cls else kind or 'unknown'}) has no context-parallel plan in "
                           "diffusers (`_cp_plan`); set context_parallel_size: 1 (FSDP2 alone), or use a family "
                           "that has one (Wan)"]
    if kind in UNSPLIT:
        return problems + [f"{key}context_parallel_size={degree}: {type(policy).__name__}'s denoiser ({kind}) is not "
                           f"split by flowrl: {UNSPLIT[kind]}; set context_parallel_size: 1 (FSDP2 alone shards its "
                           "weights)"]
    if kind not in SEQUENCES:
        return problems + [f"{key}context_parallel_size={degree}: flowrl does not yet split {type(policy).__name__}'s "
                           f"sequence (it splits {list(SEQUENCES)}); set context_parallel_size: 1"]
    if not hasattr(policy, "denoiser_config"):  # a stand-in for a policy whose folder is missing: no sizes yet
        return problems
    tokens, heads = split_sequence(policy)
    if tokens % degree:
        problems.append(f"{key}context_parallel_size={degree} does not divide the clip's {tokens} patch tokens "
                        "(latent frames x patch rows x patch columns); change policy.num_frames / height / width "
                        f"or the degree to a divisor of {tokens}")
    if attention == "ulysses" and heads % degree:
        problems.append(f"{key}context_parallel_size={degree} with ulysses attention does not divide the model's "
                        f"{heads} attention heads (each process attends with heads / degree); use a divisor of "
                        f"{heads}, or context_parallel_attention: ring (GPU)")
    return problems


def _denoiser_class(policy: Any) -> Optional[type]:
    """The diffusers class of ``policy``'s denoiser (Wan's experts are two of one class), None when unknown."""
    import diffusers

    from flowrl.policies.skeleton import DENOISER_CLASSES

    kind = getattr(policy, "denoiser_kind", "")
    return getattr(diffusers, DENOISER_CLASSES.get(kind, kind), None) if kind else None


def cp_models(denoiser: nn.Module) -> list[nn.Module]:
    """The diffusers models inside ``denoiser`` that carry a ``_cp_plan`` (a Wan denoiser's experts and their full
    fine-tuning reference copies, or the denoiser itself), outermost first."""
    return [m for m in denoiser.modules() if getattr(type(m), "_cp_plan", None) is not None]


def enable_context_parallel(policy: Any, mesh, backend: Optional[str] = None) -> list[nn.Module]:
    """Split ``policy``'s denoiser's sequence over ``mesh``'s ``ring`` and ``ulysses`` dimensions with diffusers'
    ``enable_parallelism``, on its loaded models after their LoRA adapters exist (the plan's hooks must sit on the
    adapted ``proj_out``); models already split are left as they are. Returns the models it split.

    Args:
        mesh: a ``DeviceMesh`` with ``ring`` and ``ulysses`` dimensions (one of them of size 1).
        backend: diffusers' attention backend (``set_attention_backend``); None keeps the model's (``native``),
            which runs Ulysses only; ring attention needs one of :data:`RING_BACKENDS`.
    """
    from diffusers import ContextParallelConfig

    models = [m for m in cp_models(policy.denoiser) if m._parallel_config is None]  # configure_model runs again
    for model in models:
        if backend is not None:
            model.set_attention_backend(backend)
        config = ContextParallelConfig(ring_degree=mesh["ring"].size(), ulysses_degree=mesh["ulysses"].size(),
                                       mesh=mesh)
        with _cpu_device_count():
            model.enable_parallelism(config=config)
    return models


@contextmanager
def _cpu_device_count() -> Iterator[None]:
    """diffusers 0.42.1's ``_resolve_parallel_config`` places the config on device
    ``rank % torch.accelerator.device_count()``, a ZeroDivisionError on a machine without an accelerator: there,
    within this context, the CPU counts as one device (the config's device is then ``cpu``, which it is)."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = count
