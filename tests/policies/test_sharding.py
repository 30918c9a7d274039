"""The FSDP2 sharding plan names real block lists of every supported denoiser (built from the tests' tiny configs),
so a renamed attribute in diffusers fails here rather than silently leaving a model unsharded."""

import pytest
from torch import nn

from flowrl.policies.sharding import SHARDED_BLOCKS, denoiser_blocks
from flowrl.policies.tiny_components import build_transformer
from tests.policies.tiny_editing import flux_kontext_components, qwen_image_edit_components
from tests.policies.tiny_families import flux2_klein_components, qwen_image_components, zimage_transformer
from tests.policies.tiny_ltx2 import transformer as ltx2_transformer
from tests.policies.tiny_pipelines import flux_components
from tests.policies.tiny_qwen21 import qwen_image21_components
from tests.policies.tiny_sd15 import sd15_components
from tests.policies.tiny_wan import transformer as wan_transformer


def wan_experts(two: bool):
    from flowrl.policies.wan_experts import WanExperts

    return WanExperts(wan_transformer(), wan_transformer() if two else None, 875.0 if two else None)


def published_hunyuan15():
    """``HunyuanVideo15Transformer3DModel``'s defaults (the 8.3B model: 54 blocks, 2048 wide), weightless."""
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        return HunyuanVideo15Transformer3DModel()


def wan_full_finetuning_of_one_expert():
    """Wan 2.2 training ``transformer`` whole: its reference copy is sharded too, the frozen expert has none."""
    from flowrl.policies.wan_experts import WanExperts

    experts = WanExperts(wan_transformer(), wan_transformer(), 875.0, trained=["transformer"])
    experts.setup_reference()
    return experts


@pytest.mark.parametrize("build,expected", [
    (lambda: build_transformer(num_layers=2), ["transformer_blocks.0", "transformer_blocks.1"]),
    (lambda: flux_components()["transformer"], ["transformer_blocks.0", "single_transformer_blocks.0"]),
    (lambda: sd15_components()["unet"], ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0",
                                         "up_blocks.1"]),
    (lambda: qwen_image_components()["transformer"], ["transformer_blocks.0", "transformer_blocks.1"]),
    (lambda: qwen_image21_components()["transformer"], ["transformer_blocks.0", "transformer_blocks.1"]),
    (lambda: flux2_klein_components()["transformer"], ["transformer_blocks.0", "single_transformer_blocks.0"]),
    # Z-Image at width 128: at the tests' width 32 its timestep MLP (1024 wide whatever the model width) outweighs
    # the blocks, which it does not in the 6B model
    (lambda: zimage_transformer(dim=128), ["noise_refiner.0", "context_refiner.0", "layers.0", "layers.1"]),
    # the editing families' transformers are the text-to-image classes (Qwen-Image-Edit-2511's with zero_cond_t)
    (lambda: qwen_image_edit_components(zero_cond_t=True)["transformer"], ["transformer_blocks.0",
                                                                          "transformer_blocks.1"]),
    (lambda: flux_kontext_components()["transformer"], ["transformer_blocks.0", "single_transformer_blocks.0"]),
    # HunyuanVideo 1.5 at its published size on the meta device: at a tiny width its ByT5 projection (2048 wide
    # whatever the model width) outweighs the blocks, which it does not in the 8.3B model
    (published_hunyuan15, [f"transformer_blocks.{i}" for i in range(54)]),
    (lambda: wan_experts(False), ["transformer.blocks.0", "transformer.blocks.1", "transformer"]),
    (lambda: wan_experts(True), ["transformer.blocks.0", "transformer.blocks.1", "transformer",
                                 "transformer_2.blocks.0", "transformer_2.blocks.1", "transformer_2"]),
    (wan_full_finetuning_of_one_expert, ["transformer.blocks.0", "transformer.blocks.1", "transformer",
                                         "transformer_2.blocks.0", "transformer_2.blocks.1", "transformer_2",
                                         "reference_experts.transformer.blocks.0",
                                         "reference_experts.transformer.blocks.1", "reference_experts.transformer"]),
    # LTX-2 with 6 blocks: at the tests' width its time and cross-modal modulation embeddings outweigh 2 blocks, which
    # they do not in the 48-block model
    (lambda: ltx2_transformer(num_layers=6), [f"transformer_blocks.{i}" for i in range(6)]),
], ids=["sd3", "flux", "sd15", "qwen_image", "qwen_image21", "flux2", "zimage", "qwen_edit", "kontext", "hunyuan15",
        "wan21", "wan22", "wan22-reference", "ltx2"])
def test_each_denoiser_shards_its_blocks(build, expected):
    denoiser = build()
    blocks = denoiser_blocks(denoiser)
    assert [name for name, _ in blocks] == expected
    # the blocks hold most of the weights: the root unit keeps only embeddings and the output layers
    inside = sum(p.numel() for _, block in blocks for p in block.parameters())
    assert inside > 0.5 * sum(p.numel() for p in denoiser.parameters())


def test_a_denoiser_without_a_plan_is_named():
    with pytest.raises(ValueError, match="no FSDP2 sharding plan for a Linear denoiser.*SHARDED_BLOCKS"):
        denoiser_blocks(nn.Linear(2, 2))
    assert set(SHARDED_BLOCKS) == {"SD3Transformer2DModel", "FluxTransformer2DModel", "UNet2DConditionModel",
                                   "QwenImageTransformer2DModel", "QwenImage21Transformer2DModel",
                                   "Flux2Transformer2DModel", "ZImageTransformer2DModel",
                                   "HunyuanVideo15Transformer3DModel", "WanExperts", "LTX2VideoTransformer3DModel"}
