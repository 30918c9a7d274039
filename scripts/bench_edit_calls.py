"""The editing adapters' rows of ``bench_models.py``: Qwen-Image-Edit-Plus and FLUX.1 Kontext on their tiny pipelines
(as the tests build them), and their bare transformer calls as each pipeline's loop makes them: the noisy image's
packed tokens followed by the source's, both layouts (Qwen: ``img_shapes``; Kontext: position ids with first
coordinate 1), the source outputs dropped, then the pipeline's guidance (Qwen: true CFG as one batch and the norm
rescale; Kontext: the guidance input). The source tokens are the adapter's (encoded once per record), so both sides
of the comparison read the same conditioning, as the other rows share the prompt encodings."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from flowrl.policies import LoraOptions
from flowrl.policies.source_latents import SOURCE, SOURCE_GRID
from scripts.bench_models import Bare, euler

EDIT_MODELS = ("qwen_edit", "kontext")


def qwen_edit_transformer(policy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """Qwen-Image-Edit-Plus: noisy then source tokens, their shapes, true CFG as one batch, the norm rescale."""
    from diffusers import QwenImageEditPlusPipeline

    c, h, w = policy.latent_shape()
    layout = [tuple(g) for g in cond.shared[SOURCE_GRID][0].tolist() if g != [0, 0]]
    shapes = [(1, h // 2, w // 2), *[(1, a, b) for a, b in layout]]
    embeds = torch.cat([cond.null_embeds, cond.embeds])
    masks = torch.cat([cond.null_extra["mask"], cond.extra["mask"]])
    sources, n, tokens = torch.cat([cond.shared[SOURCE]] * 2), len(cond.embeds), (h // 2) * (w // 2)

    def output(z, k, rows):
        both = torch.cat([rows, rows + n])
        out = policy.denoiser(hidden_states=torch.cat([torch.cat([z, z]), sources[both]], 1),
                              timestep=sigmas[k].repeat(2), encoder_hidden_states=embeds[both],
                              encoder_hidden_states_mask=masks[both], img_shapes=[shapes] * (2 * len(z)),
                              return_dict=False)[0][:, :tokens]
        neg, pos = out.chunk(2)
        combined = neg + guidance * (pos - neg)
        return combined * (pos.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))

    return Bare(output, euler(sigmas), lambda z: QwenImageEditPlusPipeline._pack_latents(z, len(z), c, h, w))


def kontext_transformer(policy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """FLUX.1 Kontext: noisy then source tokens, the source's ids with first coordinate 1, embedded guidance."""
    from diffusers import FluxKontextPipeline

    c, h, w = policy.latent_shape()
    (gh, gw), = cond.shared[SOURCE_GRID][0].tolist()
    source_ids = FluxKontextPipeline._prepare_latent_image_ids(1, gh, gw, "cpu", torch.float32)
    source_ids[..., 0] = 1
    ids = torch.cat([FluxKontextPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32),
                     source_ids])
    text_ids, tokens = torch.zeros(cond.embeds.shape[1], 3), (h // 2) * (w // 2)

    def output(z, k, rows):
        g = torch.full((len(z),), float(guidance))
        return policy.denoiser(hidden_states=torch.cat([z, cond.shared[SOURCE][rows]], 1), timestep=sigmas[k],
                               guidance=g, pooled_projections=cond.pooled[rows],
                               encoder_hidden_states=cond.embeds[rows], txt_ids=text_ids, img_ids=ids,
                               return_dict=False)[0][:, :tokens]

    return Bare(output, euler(sigmas), lambda z: FluxKontextPipeline._pack_latents(z, len(z), c, h, w))


def edit_model(name: str, root: Path, lora: LoraOptions) -> tuple:
    """The editing adapter on its tiny pipeline and its bare-call builder."""
    from diffusers import FluxKontextPipeline, QwenImageEditPlusPipeline

    from flowrl.policies import FluxKontextPolicy, QwenImageEditPolicy
    from tests.policies.tiny_editing import (CONDITION_AREA, SOURCE_AREA, flux_kontext_components,
                                             qwen_image_edit_components)
    from tests.policies.tiny_pipelines import save_pipeline

    if name == "qwen_edit":
        path = save_pipeline(QwenImageEditPlusPipeline, qwen_image_edit_components, root / name)
        return QwenImageEditPolicy(str(path), lora=lora, resolution=32, source_area=SOURCE_AREA,
                                   condition_area=CONDITION_AREA).load(), qwen_edit_transformer
    path = save_pipeline(FluxKontextPipeline, flux_kontext_components, root / name)
    return FluxKontextPolicy(str(path), lora=lora, resolution=32, source_area=32 * 32,
                             max_sequence_length=16).load(), kontext_transformer


def edit_images(name: str, prompts: list[str]) -> Optional[list[list[Tensor]]]:
    """One 32 x 32 source image per prompt (one per distinct prompt: a group shares its record's) for an editing
    model; None for the others."""
    if name not in EDIT_MODELS:
        return None
    from tests.policies.tiny_editing import source_images

    distinct = {p: source_images(1, size=(3, 32, 32), seed=i)[0] for i, p in enumerate(dict.fromkeys(prompts))}
    return [[distinct[p]] for p in prompts]

