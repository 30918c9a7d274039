"""Pipeline adapters whose prompt encodings differ in length from prompt to prompt (the chat-templated LLM encoders
of Qwen-Image, FLUX.2 and Z-Image keep only the real tokens).

Each distinct prompt is encoded once through the pipeline's own ``encode_prompt`` and cached unpadded; a batch is
zero-padded to the length of its longest encoding, both CFG sides to one length so that they run as one batch, and
``Conditioning.extra["mask"]`` / ``null_extra["mask"]`` (``[B, L]`` bool, True on real tokens) tell the adapter's
``_forward`` which tokens are real. Every row keeps its own tokens whatever the batch it lands in, so a trajectory's
conditioning does not depend on its batch.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from flowrl.policies.base import Conditioning
from flowrl.policies.pipeline_policy import PipelinePolicy

#: the key of the token masks in ``Conditioning.extra`` and ``null_extra``
MASK = "mask"


def pad_rows(rows: Sequence[Tensor], length: int) -> tuple[Tensor, Tensor]:
    """Encodings ``[L_i, D]`` zero-padded to ``[B, length, D]``, and their mask ``[B, length]`` (True: a real token).

    >>> embeds, mask = pad_rows([torch.ones(2, 3), torch.ones(1, 3)], 3)
    >>> embeds.sum(dim=(1, 2)).tolist(), mask.tolist()
    ([6.0, 3.0], [[True, True, False], [True, False, False]])
    """
    first = rows[0]
    embeds = first.new_zeros(len(rows), length, first.shape[-1])
    mask = torch.zeros(len(rows), length, dtype=torch.bool, device=first.device)
    for i, row in enumerate(rows):
        embeds[i, :len(row)] = row
        mask[i, :len(row)] = True
    return embeds, mask


def unpadded(embeds: Tensor, mask: Optional[Tensor]) -> list[Tensor]:
    """The real tokens of each row of ``embeds [B, L, D]`` (all of them where ``mask`` is None).

    >>> [row.shape[0] for row in unpadded(torch.zeros(2, 3, 1), torch.tensor([[1, 1, 0], [1, 0, 0]]))]
    [2, 1]
    """
    if mask is None:
        return list(embeds)
    return [row[keep.bool()] for row, keep in zip(embeds, mask)]


class PaddedPromptPolicy(PipelinePolicy):
    """Base of the adapters with variable-length prompt encodings. Subclasses implement ``_encode_rows`` (the
    pipeline's encodings of distinct prompts, one ``[L_i, D]`` tensor each) and set ``negative_prompt`` (the
    unconditional side's prompt) and ``classifier_free`` (False: a guidance-distilled model, no unconditional side).
    """

    negative_prompt: str = ""
    classifier_free: bool = True

    def _encode_rows(self, prompts: list[str]) -> list[Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def _rows(self, prompts: list[str]) -> list[Tensor]:
        """Encodings of ``prompts`` (repeats allowed), each distinct prompt encoded once and then cached."""
        found = self.prompt_cache.lookup(prompts, lambda missing: [(row,) for row in self._encode_rows(missing)])
        device = self.denoiser.device
        return [found[p][0].to(device) for p in prompts]

    def encode(self, prompts: list[str], images: Optional[list[list[Tensor]]] = None) -> Conditioning:
        """The prompts and, for classifier-free guidance, ``negative_prompt``, padded to one length with masks."""
        self.check_images(images)
        rows = self._rows(list(prompts))
        null = self._rows([self.negative_prompt] * len(prompts)) if self.classifier_free else []
        length = max(len(row) for row in rows + null)
        embeds, mask = pad_rows(rows, length)
        if not null:
            return Conditioning(embeds, extra={MASK: mask})
        null_embeds, null_mask = pad_rows(null, length)
        return Conditioning(embeds, None, null_embeds, None, extra={MASK: mask}, null_extra={MASK: null_mask})
