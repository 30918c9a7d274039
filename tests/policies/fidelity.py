"""Every family held against its plain diffusers pipeline on a tiny random-weight folder: the largest absolute
difference of the prompt encodings, the sigma grid, the first step's guided velocity and a short deterministic sample
(``generate``'s :meth:`~flowrl.methods.generation.Generation.final_latents`) from the pipeline's own call with the same
start ``latents``. The guided velocity is the ``model_output`` the pipeline hands its scheduler's ``step`` at the
first step; the sample is the latents its step-end callback sees after the last.

The cases use the published scheduler configs (FLUX.1's and Qwen-Image's dynamic shifts, Qwen-Image's terminal sigma,
Wan's UniPC with its flow shift and Wan 2.2's ``boundary_ratio``), a negative prompt longer than the prompts where the
family takes one, and non-square sizes where the family's policy has them (Wan's videos, the editors' sources). The
test (``test_fidelity.py``) and ``scripts/fidelity_table.py`` (the Models page's table) both read :func:`measure`.
"""

from __future__ import annotations

import inspect
import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import diffusers
import torch
from torch import Tensor

from flowrl.methods import FlowGRPO
from tests.policies.pipeline_oracle import PROMPTS, SEEDS, start_noise

#: longer than either prompt, so the unconditional side is the longer one where a family pads both to one length
NEGATIVE = "blurry, low quality, distorted, oversaturated, watermark, text, jpeg artifacts, deformed hands"
STEPS, GUIDANCE = 3, 3.0
MEASURES = ("encode", "sigmas", "velocity", "sample")


def gap(ours: Tensor, theirs: Tensor) -> float:
    """The largest absolute difference; ``ours`` may be longer along dim 1 (padded to a batch's length), and then
    its padding must be zeros (counted in the difference)."""
    if ours.ndim >= 2 and theirs.ndim == ours.ndim and ours.shape[1] > theirs.shape[1]:
        pad = ours[:, theirs.shape[1]:].abs().max().item()
        return max(pad, gap(ours[:, :theirs.shape[1]], theirs))
    return (ours.float() - theirs.float()).abs().max().item()


@dataclass(frozen=True)
class Case:
    """One family's comparison on the first ``rows`` of :data:`PROMPTS`.

    ``folder``: a key of :func:`folders`; ``build``: the policy on it; ``pipeline``: the pipeline's class name;
    ``call(policy, pipe, guidance)``: the pipeline's arguments besides ``latents`` and the steps; ``encode(pipe,
    cond)``: the pipeline's encodings paired with the policy's; ``pack``: the policy's latents in the layout of the
    pipeline's steps (``start``: of its ``latents`` argument, default ``pack``); ``images``: each prompt's
    conditioning images; ``sigmas``: the pipeline's grid in the policy's terms; ``sizes``: a context both are built
    and run in; ``solver``: the scheduler class the pipeline is given (SD1.5's DDIM, as flowrl steps it, in place of
    the folder's PNDM).
    """

    folder: str
    build: Callable
    pipeline: str
    call: Callable
    encode: Callable
    pack: Callable = lambda policy, z: z
    images: Optional[Callable] = None
    sigmas: Callable = lambda pipe: pipe.scheduler.sigmas
    sizes: Callable = nullcontext
    start: Optional[Callable] = None
    solver: Optional[str] = None
    rows: int = 2


def packed(pipeline: str) -> Callable:
    """The policy's ``[B, C, h, w]`` latents packed into tokens as ``pipeline``'s ``_pack_latents``."""
    def pack(policy, z):
        c, h, w = policy.latent_shape()
        return getattr(diffusers, pipeline)._pack_latents(z, len(z), c, h, w)
    return pack


def measure(case: Case, path: str, steps: int = STEPS, guidance: float = GUIDANCE) -> dict[str, float]:
    """The four largest differences of ``case`` on the folder ``path`` (see the module doc)."""
    with case.sizes():
        policy = case.build(path)
        pipe = getattr(diffusers, case.pipeline).from_pretrained(path)
        pipe.set_progress_bar_config(disable=True)
        if case.solver:
            pipe.scheduler = getattr(diffusers, case.solver).from_config(pipe.scheduler.config)
        images = case.images() if case.images else None
        prompts, seeds = list(PROMPTS[:case.rows]), SEEDS[:case.rows]
        cond = policy.encode(prompts, images=images)
        encode = max(gap(ours, theirs) for ours, theirs in case.encode(pipe, cond))
        outputs, seen = [], {}
        step = pipe.scheduler.step
        pipe.scheduler.step = lambda out, *a, **k: outputs.append(out) or step(out, *a, **k)
        noise = start_noise(policy, seeds)
        call = dict(**case.call(policy, pipe, guidance), latents=(case.start or case.pack)(policy, noise),
                    num_inference_steps=steps, output_type="latent")
        if "callback_on_step_end" in inspect.signature(pipe.__call__).parameters:
            pipe(**call, callback_on_step_end=lambda p, i, t, tensors: seen.update(tensors) or {})
        else:  # HunyuanVideo 1.5 takes no step callback: its latent output is the last step's latents
            seen["latents"] = pipe(**call).frames
        sigmas = policy.sigmas(steps)
        with torch.no_grad():
            velocity = policy.velocity(noise, sigmas[:1].expand(len(noise)), cond, guidance)
        ddim = {"step_kind": "ddim"} if policy.prediction == "epsilon" else {}  # the method's own ODE is then DDIM's
        final = FlowGRPO(policy, guidance_scale=guidance, **ddim).generation.final_latents(cond, seeds, steps)
    return {"encode": encode, "sigmas": gap(sigmas, case.sigmas(pipe)),
            "velocity": gap(case.pack(policy, velocity), outputs[0]),
            "sample": gap(case.pack(policy, final), seen["latents"])}


def with_scheduler(path: str, scheduler, out: Path) -> str:
    """A copy of the folder ``path`` whose scheduler is ``scheduler`` (a published config on a tiny model)."""
    if not (out / "model_index.json").is_file():
        shutil.copytree(path, out)
        shutil.rmtree(out / "scheduler")
        scheduler.save_pretrained(out / "scheduler")
        index = (out / "model_index.json").read_text()
        (out / "model_index.json").write_text(index.replace('"FlowMatchEulerDiscreteScheduler"',
                                                            f'"{type(scheduler).__name__}"'))
    return str(out)


def unipc(flow_shift: float):
    """The published Wan folders' scheduler."""
    return diffusers.UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=flow_shift,
                                             prediction_type="flow_prediction")


def folders(root: Path) -> dict[str, str]:
    """Every tiny folder the cases read, built and saved under ``root``, by the name of the policies' conftest
    fixture that builds it (the Wan folders: :func:`published_wan`)."""
    from tests.policies import tiny_editing, tiny_families, tiny_pipelines, tiny_qwen21, tiny_sd15, tiny_wan

    save = tiny_pipelines.save_pipeline
    made = {"sd3_dir": save(diffusers.StableDiffusion3Pipeline, tiny_pipelines.sd3_components, root / "sd3"),
            "flux_dir": save(diffusers.FluxPipeline, tiny_pipelines.flux_components, root / "flux"),
            "sd15_dir": tiny_sd15.save_sd15(root / "sd15"),
            "qwen_image_dir": save(diffusers.QwenImagePipeline, tiny_families.qwen_image_components, root / "qwen"),
            "qwen_image21_dir": save(diffusers.QwenImage21Pipeline, tiny_qwen21.qwen_image21_components,
                                     root / "qwen21"),
            "flux2_dir": save(diffusers.Flux2KleinPipeline, tiny_families.flux2_klein_components, root / "flux2"),
            "zimage_dir": save(diffusers.ZImagePipeline, tiny_families.zimage_components, root / "zimage"),
            "flux_kontext_dir": save(diffusers.FluxKontextPipeline, tiny_editing.flux_kontext_components,
                                 root / "kontext"),
            "qwen_edit_dir": save(diffusers.QwenImageEditPipeline, tiny_editing.qwen_image_edit_components,
                                  root / "qwen_edit"),
            "qwen_edit_plus_dir": save(diffusers.QwenImageEditPlusPipeline, tiny_editing.qwen_image_edit_components,
                                   root / "qwen_edit_plus")}
    made = {name: str(path) for name, path in made.items()}
    return {**made, **published_wan(tiny_wan.save_all(root / "wan"), root), **hunyuan15_folders(root)}


def hunyuan15_folders(root: Path) -> dict[str, str]:
    """The tiny HunyuanVideo 1.5 folders (``tests.policies.tiny_hunyuan15``): ``hunyuan15_t2v``, ``hunyuan15_i2v``."""
    from tests.policies import tiny_hunyuan15, tiny_pipelines

    save = tiny_pipelines.save_pipeline
    return {"hunyuan15_t2v": str(save(diffusers.HunyuanVideo15Pipeline, tiny_hunyuan15.hunyuan15_t2v,
                                      root / "hunyuan15_t2v")),
            "hunyuan15_i2v": str(save(diffusers.HunyuanVideo15ImageToVideoPipeline, tiny_hunyuan15.hunyuan15_i2v,
                                      root / "hunyuan15_i2v", seed=1))}


def published_wan(wan: dict[str, str], root: Path) -> dict[str, str]:
    """The tiny Wan folders with their published schedulers: Wan 2.1 T2V and I2V UniPC at flow_shift 3, Wan 2.2 T2V
    at 12 (boundary 0.875, as the ``wan22`` folder is), Wan 2.2 I2V at 5 (boundary 0.9)."""
    return {"wan21": with_scheduler(wan["wan21"], unipc(3.0), root / "wan21_unipc"), "wan22": wan["wan22"],
            "wan21_i2v": with_scheduler(wan["wan21_i2v"], unipc(3.0), root / "wan21_i2v_unipc"),
            "wan22_i2v": with_scheduler(wan["wan22_i2v"], unipc(5.0), root / "wan22_i2v_unipc")}
