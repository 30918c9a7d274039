"""Checks of a run against the machine it starts on: an accelerator the machine does not have (checked on the parsed
config, before any weight loads: Lightning would say "No supported gpu backend found!" only after the model has
loaded), and a batch whose rollout cannot fit in the memory there (checked on the built method, before the first
batch: the sampler would otherwise fill the memory until the machine swaps or the kernel kills the run).

The memory rule is a lower bound, so it never refuses a run that fits: a rollout keeps every sample's latents at every
sampling step in float32 (``Rollout.latents [B, T+1, *latent_shape]``), i.e.
``samples per process x (num_steps + 1) x latent elements x 4 bytes``; the model's activations, the decoded images
and a tree's inner nodes come on top. It is compared with the memory free now on the device the rollout runs on
(``psutil.virtual_memory().available`` on a CPU, ``torch.cuda.mem_get_info`` on a GPU).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

_GPU_NAMES = ("gpu", "cuda")


def accelerator_problems(trainer: dict) -> list[str]:
    """``trainer.accelerator`` asking for a GPU (``gpu``/``cuda``) or ``mps`` this machine does not have, and
    ``trainer.devices`` beyond the GPUs it has.

    >>> accelerator_problems({"accelerator": "cpu", "devices": 1}), accelerator_problems({"accelerator": "auto"})
    ([], [])
    """
    accelerator = trainer.get("accelerator")
    if not isinstance(accelerator, str):
        return []  # an Accelerator object or a class node: Lightning checks it
    accelerator = accelerator.lower()
    fix = ("; run it on a machine with one, or here with --trainer.accelerator=cpu (or auto: whatever this machine "
           "has), --trainer.devices=1 and --trainer.strategy=auto (a full-size model takes hours a step on a CPU: "
           "try a tiny config, configs/tiny_*.yaml)")
    if accelerator in _GPU_NAMES and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a build without CUDA"
        return [f"trainer.accelerator={accelerator}: this machine has no GPU that torch can use "
                f"(torch.cuda.is_available() is False; torch {torch.__version__}, {built}){fix}"]
    if accelerator == "mps" and not torch.backends.mps.is_available():
        return [f"trainer.accelerator=mps: this machine has no Apple-silicon GPU torch can use{fix}"]
    devices = trainer.get("devices")
    if accelerator in _GPU_NAMES and isinstance(devices, int) and devices > (count := torch.cuda.device_count()):
        return [f"trainer.devices={devices}: this machine has {count} GPU{'s' if count > 1 else ''}; use "
                f"--trainer.devices={count} (or -1: all of them), or start the run on a larger machine"]
    return []


def rollout_bytes(samples: int, num_steps: int, latent_shape: Sequence[int]) -> int:
    """The memory a rollout's latents take at least (see the module docstring).

    >>> rollout_bytes(1_600_000, 6, (3, 16, 16)) / 2**30  # 1.6 M samples x 7 states x 768 floats x 4 bytes
    32.04...
    """
    return samples * (num_steps + 1) * math.prod(latent_shape) * 4


def free_memory(device: Any) -> Optional[int]:
    """Bytes free now on ``device`` (a ``torch.device``); None where it cannot be read."""
    if getattr(device, "type", None) == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if getattr(device, "type", None) == "cpu":
        import psutil

        return psutil.virtual_memory().available
    return None


def rollout_memory_problems(samples: int, num_steps: int, latent_shape: Sequence[int], free: Optional[int],
                            where: str = "cpu") -> list[str]:
    """A batch whose rollout alone needs more than the ``free`` bytes, with the estimate and the fix.

    >>> rollout_memory_problems(1_600_000, 6, (3, 16, 16), 16 * 2**30)[0][:86]
    'a batch of 1,600,000 samples per process needs at least 32.0 GiB for its rollout alone'
    >>> rollout_memory_problems(128, 6, (3, 16, 16), 16 * 2**30)
    []
    """
    need = rollout_bytes(samples, num_steps, latent_shape)
    if free is None or need <= free:
        return []
    fits = max(1, int(samples * free / need))
    return [f"a batch of {samples:,} samples per process needs at least {need / 2**30:.1f} GiB for its rollout alone "
            f"({samples:,} samples x {num_steps + 1} states x {math.prod(latent_shape):,} latent values "
            f"{tuple(latent_shape)} x 4 bytes; activations and images come on top), and {where} has "
            f"{free / 2**30:.1f} GiB free; lower data.group_size x data.num_groups per process below {fits:,} (fewer "
            "samples per prompt, fewer prompts, or more processes)"]
