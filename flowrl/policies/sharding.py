"""The sharding plan of a policy under FSDP2 (``torch.distributed.fsdp.fully_shard``): what is split over the ranks.

Each block of the denoiser is its own FSDP unit: its weights are all-gathered just before its forward and freed right
after (``reshard_after_forward``), and its gradients are reduce-scattered as its backward ends, so a rank holds its
1/N shard of every weight plus one block's full weights at a time. The denoiser itself is the root unit, holding
what is left (patch and time embeddings, the final norm and projection). LoRA adapters live inside the blocks' linear
layers (peft), so they are sharded with them; FSDP2 keeps frozen and trained weights side by side in one unit.

A full fine-tuning reference (``reference_denoiser``, the frozen copy the KL compares with; for Wan the trained
experts' copies inside the denoiser, ``reference_experts``) is sharded the same way, so it costs each rank a shard,
never a whole copy.

Text encoders and the VAE stay whole on every rank, frozen and in eval: each rank encodes its own prompts through a
per-rank cache and decodes its own images, and a sharded encoder would turn every one of those calls into a
collective that the ranks' different cache hits could not keep in step. For T5-XXL (SD3, FLUX) that is ~9 GB per rank
in bf16; ``text_encoder_3: false`` drops it. The LLM encoders of the newer families cost more: Qwen2.5-VL-7B
(Qwen-Image) ~16 GB, Mistral-Small-3.1 24B (FLUX.2 [dev]) ~48 GB, Qwen3-4B / 8B (Z-Image, FLUX.2 [klein]) ~8 / 16 GB
per rank in bf16.
"""

from __future__ import annotations

from torch import nn

#: the block lists of each denoiser class that become FSDP units (every element of a ``ModuleList``, or the module)
SHARDED_BLOCKS: dict[str, tuple[str, ...]] = {
    "SD3Transformer2DModel": ("transformer_blocks",),  # SD3 / SD3.5 and the embedded tiny model
    "FluxTransformer2DModel": ("transformer_blocks", "single_transformer_blocks"),
    "Flux2Transformer2DModel": ("transformer_blocks", "single_transformer_blocks"),  # FLUX.2 [klein], [dev]
    "QwenImageTransformer2DModel": ("transformer_blocks",),
    # Qwen-Image 2.1: the single-stream blocks; the shared modulation and the input projections stay in the root unit
    "QwenImage21Transformer2DModel": ("transformer_blocks",),
    # Z-Image: the image and caption refiners run before the main single-stream layers
    "ZImageTransformer2DModel": ("noise_refiner", "context_refiner", "layers"),
    # HunyuanVideo 1.5: the double-stream blocks; the token refiner and the embedders stay in the root unit
    "HunyuanVideo15Transformer3DModel": ("transformer_blocks",),
    "UNet2DConditionModel": ("down_blocks", "mid_block", "up_blocks"),  # SD1.5
    # LTX-2: each joint audio-video block (both streams and their cross-modal attention in one unit)
    "LTX2VideoTransformer3DModel": ("transformer_blocks",),
    # Wan (flowrl.policies.wan_experts): every block of each expert, then each expert with what is left of it (patch
    # and condition embeddings, output norm and projection), so an expert's weights are gathered only when it runs;
    # the same for full fine-tuning's reference copies of the trained experts
    "WanExperts": ("transformer.blocks", "transformer", "transformer_2.blocks", "transformer_2",
                   "reference_experts.transformer.blocks", "reference_experts.transformer",
                   "reference_experts.transformer_2.blocks", "reference_experts.transformer_2"),
}


def denoiser_blocks(denoiser: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the denoiser's FSDP units below the root, in forward order.

    Raises:
        ValueError: a denoiser class with no plan in :data:`SHARDED_BLOCKS`.
    """
    kind = type(denoiser).__name__
    if kind not in SHARDED_BLOCKS:
        raise ValueError(f"no FSDP2 sharding plan for a {kind} denoiser; add its block lists to "
                         f"flowrl.policies.sharding.SHARDED_BLOCKS (known: {sorted(SHARDED_BLOCKS)})")
    out = []
    for attr in SHARDED_BLOCKS[kind]:
        module = denoiser
        for part in attr.split("."):  # a dotted path reaches into a sub-module (an expert's blocks)
            module = getattr(module, part, None)
        if isinstance(module, nn.ModuleList):
            out += [(f"{attr}.{i}", block) for i, block in enumerate(module)]
        elif module is not None:
            out.append((attr, module))
    return out


def shard_policy(policy: nn.Module, mesh, reshard_after_forward: bool = True) -> list[str]:
    """Apply the plan in place: ``fully_shard`` each block of the denoiser (and of the frozen reference, if any),
    then the denoiser as the root unit. Text encoders and VAE are left whole. Returns the sharded modules' names.

    Args:
        policy: a :class:`~flowrl.policies.base.FlowPolicy` (its ``denoiser`` and ``reference_denoiser``).
        mesh: the 1-D data-parallel ``DeviceMesh`` the weights are split over.
        reshard_after_forward: free a unit's gathered weights after its forward (False keeps them until the
            backward: faster, more memory).
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    sharded = []
    for attr in ("denoiser", "reference_denoiser"):
        denoiser = getattr(policy, attr, None)
        if denoiser is None or isinstance(denoiser, FSDPModule):  # configure_model runs again for validate/test
            continue
        for name, block in denoiser_blocks(denoiser):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
            sharded.append(f"{attr}.{name}")
        fully_shard(denoiser, mesh=mesh, reshard_after_forward=reshard_after_forward)
        sharded.append(attr)
    return sharded


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` is an FSDP2 unit (every forward all-gathers its weights: a collective all ranks must make
    the same number of times)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)
