"""The bare model calls of the Qwen-Image, FLUX.2 [klein] and Z-Image adapters for ``bench_models.py``: each
transformer called as its diffusers pipeline calls it, in the pipeline's own latent layout, with the CFG pair as one
batch (as the other rows of the benchmark) and the pipeline's guidance arithmetic."""

from __future__ import annotations

import torch
from torch import Tensor

from scripts.bench_models import Bare, euler


def qwen_image_transformer(policy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """Qwen-Image on 2x2-packed latents with its image shapes and text masks; true CFG, then the per-token norm
    rescale of ``QwenImagePipeline``."""
    from diffusers import QwenImagePipeline

    c, h, w = policy.latent_shape()
    embeds = torch.cat([cond.null_embeds, cond.embeds])
    masks = torch.cat([cond.null_extra["mask"], cond.extra["mask"]])
    n = len(cond.embeds)

    def output(z, k, rows):
        both = torch.cat([rows, rows + n])
        out = policy.denoiser(hidden_states=torch.cat([z, z]), timestep=sigmas[k].repeat(2),
                              encoder_hidden_states=embeds[both], encoder_hidden_states_mask=masks[both],
                              img_shapes=[[(1, h // 2, w // 2)]] * (2 * len(z)), return_dict=False)[0]
        neg, pos = out.chunk(2)
        combined = neg + guidance * (pos - neg)
        return combined * (pos.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))

    return Bare(output, euler(sigmas), lambda z: QwenImagePipeline._pack_latents(z, len(z), c, h, w))


def flux2_transformer(policy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """FLUX.2 [klein] base on its token layout with 4-D position ids, CFG on the empty prompt."""
    from diffusers import Flux2KleinPipeline

    c, h, w = policy.latent_shape()
    image_ids = Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, c, h, w))
    text_ids = Flux2KleinPipeline._prepare_text_ids(cond.embeds[:1])
    embeds, n = torch.cat([cond.null_embeds, cond.embeds]), len(cond.embeds)

    def output(z, k, rows):
        both = torch.cat([rows, rows + n])
        out = policy.denoiser(hidden_states=torch.cat([z, z]), encoder_hidden_states=embeds[both],
                              timestep=sigmas[k].repeat(2), img_ids=image_ids, txt_ids=text_ids,
                              return_dict=False)[0]
        neg, pos = out.chunk(2)
        return neg + guidance * (pos - neg)

    return Bare(output, euler(sigmas), Flux2KleinPipeline._pack_latents)


def zimage_transformer(policy, cond, sigmas: Tensor, guidance: float) -> Bare:
    """Z-Image on lists of latents and unpadded captions at reversed time, its output negated; the pipeline's
    ``pos + g (pos - neg)`` with ``g = guidance - 1``."""
    captions = ([row[keep] for row, keep in zip(cond.embeds, cond.extra["mask"])]
                + [row[keep] for row, keep in zip(cond.null_embeds, cond.null_extra["mask"])])
    n = len(cond.embeds)

    def output(z, k, rows):
        timestep = (1000 - sigmas[k] * 1000) / 1000
        picked = [captions[i] for i in torch.cat([rows, rows + n]).tolist()]
        out = policy.denoiser(list(torch.cat([z, z]).unsqueeze(2).unbind(0)), timestep.repeat(2), picked,
                              return_dict=False)[0]
        pos, neg = (-torch.stack(out).squeeze(2)).chunk(2)
        return pos + (guidance - 1) * (pos - neg)

    return Bare(output, euler(sigmas))
