"""Every flow family's sigma grid is its diffusers pipeline's, bit for bit, for the published scheduler configs (static
shift, dynamic shift, Qwen-Image's terminal stretch, SD3 with and without dynamic shifting), several image sizes (both
branches of FLUX.2's empirical ``mu``) and step counts.

The pipeline's grid is read where the pipeline makes it: its module's ``retrieve_timesteps`` is wrapped to stop the
call right after it (``pipe.scheduler.sigmas`` then hold the grid its loop would use), so no denoising step runs and
large sizes cost only their noise.
"""

import sys

import pytest
import torch
from diffusers import (FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, FluxKontextPipeline, FluxPipeline,
                       QwenImagePipeline, StableDiffusion3Pipeline, ZImagePipeline)

from flowrl.policies import Flux2Policy, FluxKontextPolicy, FluxPolicy, QwenImagePolicy, SD3Policy, ZImagePolicy

# the shift keys of the hub's scheduler/scheduler_config.json (the other keys are the scheduler's defaults)
FLUX1_DEV = {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
             "base_image_seq_len": 256, "max_image_seq_len": 4096}
FLUX1_SCHNELL = {"shift": 1.0, "use_dynamic_shifting": False}
SD35 = {"shift": 3.0}
SD3_DYNAMIC = {"shift": 3.0, "use_dynamic_shifting": True}  # the bounds: the scheduler's defaults
QWEN_IMAGE = {"shift": 1.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9,
              "base_image_seq_len": 256, "max_image_seq_len": 8192, "shift_terminal": 0.02,
              "time_shift_type": "exponential"}
Z_IMAGE_TURBO = {"shift": 3.0, "use_dynamic_shifting": False}
Z_IMAGE_DYNAMIC = {"shift": 6.0, "use_dynamic_shifting": True}
FLUX2_KLEIN = {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
               "base_image_seq_len": 256, "max_image_seq_len": 4096, "time_shift_type": "exponential"}

# family: (fixture, policy class, pipeline class, pipeline call arguments besides the prompt, size and steps)
FAMILIES = {
    "sd3": ("sd3_dir", SD3Policy, StableDiffusion3Pipeline, {"max_sequence_length": 8}),
    "flux": ("flux_dir", FluxPolicy, FluxPipeline, {"max_sequence_length": 16}),
    "qwen_image": ("qwen_image_dir", QwenImagePolicy, QwenImagePipeline, {"max_sequence_length": 16}),
    "z_image": ("zimage_dir", ZImagePolicy, ZImagePipeline, {"max_sequence_length": 32, "guidance_scale": 0.0}),
    "flux2": ("flux2_dir", Flux2Policy, Flux2KleinPipeline, {"max_sequence_length": 16}),
    # Kontext's pipeline shifts by the output's token count alone (no source image needed to read its grid); it
    # rescales its output to max_area pixels (below: the policy's square)
    "flux_kontext": ("flux_kontext_dir", FluxKontextPolicy, FluxKontextPipeline, {"max_sequence_length": 16}),
}
CASES = [("sd3", SD35), ("sd3", SD3_DYNAMIC), ("flux", FLUX1_DEV), ("flux", FLUX1_SCHNELL),
         ("qwen_image", QWEN_IMAGE), ("z_image", Z_IMAGE_TURBO), ("z_image", Z_IMAGE_DYNAMIC), ("flux2", FLUX2_KLEIN),
         ("flux_kontext", FLUX1_DEV)]


class _Stop(Exception):
    pass


def pipeline_grid(pipe, monkeypatch, **call) -> torch.Tensor:
    """``pipe.scheduler.sigmas`` right after the pipeline's own ``retrieve_timesteps`` in ``pipe(**call)``."""
    module = sys.modules[type(pipe).__module__]
    retrieve = module.retrieve_timesteps

    def stop_after(*args, **kwargs):
        retrieve(*args, **kwargs)
        raise _Stop

    monkeypatch.setattr(module, "retrieve_timesteps", stop_after)
    with pytest.raises(_Stop), torch.no_grad():
        pipe(prompt=["a red cat"], **call)
    return pipe.scheduler.sigmas


@pytest.mark.parametrize("family, config", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_sigmas_are_the_pipelines(family, config, request, monkeypatch):
    fixture, policy_class, pipeline_class, call = FAMILIES[family]
    path = request.getfixturevalue(fixture)
    pipe = pipeline_class.from_pretrained(path)
    seen = set()
    for size in (32, 256, 1024):
        policy = policy_class(path, resolution=size)  # configs only: no weight loads
        for steps in (4, 28):
            policy.scheduler = FlowMatchEulerDiscreteScheduler.from_config(config)
            pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(config)
            area = {"max_area": size * size} if family == "flux_kontext" else {}
            want = pipeline_grid(pipe, monkeypatch, num_inference_steps=steps, height=size, width=size, **call, **area)
            ours = policy.sigmas(steps)
            assert ours.dtype == torch.float32 and ours.shape == (steps + 1,) and ours[-1] == 0
            assert torch.equal(ours, want), (size, steps, ours, want)
            seen.add(tuple(ours.tolist()))
    # the cases are not vacuous: the grid depends on the size wherever the config (or FLUX.2) shifts dynamically
    dynamic = config.get("use_dynamic_shifting") or family == "flux2"
    assert len(seen) == (6 if dynamic else 2)
