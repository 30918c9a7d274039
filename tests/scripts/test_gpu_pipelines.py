"""scripts/gpu_pipelines.py's full-size pipelines fit together before a GPU ever sees them: with the transformer one
block deep (at full width) each pipeline saves, loads through its policy, and gives a finite guided velocity at a
small size, so the stand-in text encoders' widths and the stand-in VAEs' channels are the ones the published
transformers read."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


# full-width blocks on the CPU: Qwen-Image's and FLUX.2's (380 M and 560 M parameters at depth 1) take 20 s each
@pytest.mark.parametrize("family", [pytest.param("qwen_image", marks=pytest.mark.slow),
                                    pytest.param("flux2_klein_4b", marks=pytest.mark.slow), "wan21_1b3"])
def test_the_full_size_wiring_runs_one_block_deep(family, tmp_path):
    import diffusers

    from flowrl.policies import Flux2Policy, LoraOptions, QwenImagePolicy, WanPolicy
    from scripts import gpu_pipelines
    from tests.policies.tiny_pipelines import save_pipeline

    pipeline, policy_class, sizes, width = {
        "qwen_image": ("QwenImagePipeline", QwenImagePolicy, {"resolution": 64}, 3072),
        "flux2_klein_4b": ("Flux2KleinPipeline", Flux2Policy, {"resolution": 64, "max_sequence_length": 16}, 3072),
        "wan21_1b3": ("WanPipeline", WanPolicy, {"height": 32, "width": 32, "num_frames": 9,
                                                 "max_sequence_length": 16}, 1536)}[family]
    path = save_pipeline(getattr(diffusers, pipeline), lambda: getattr(gpu_pipelines, family)(layers=1), tmp_path)
    policy = policy_class(str(path), lora=LoraOptions(rank=4, alpha=8), torch_dtype="bfloat16", **sizes).load()
    assert policy.denoiser.config.get("num_layers", 1) == 1  # one block deep ...
    assert max(p.shape[0] for p in policy.denoiser.parameters() if p.ndim == 2) >= width  # ... at the published width
    cond = policy.encode(["a red cat", "a photo of a dog"])
    z = torch.randn(2, *policy.latent_shape(), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        v = policy.velocity(z, torch.tensor([0.9, 0.4]), cond, 4.0)
    assert v.shape == z.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
