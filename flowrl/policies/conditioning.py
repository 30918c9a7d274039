"""What a policy's ``encode`` hands the sampler: per-row prompt encodings, their unconditional side for
classifier-free guidance, and the tensors rows share (an edit's source latents), selected and concatenated as rows."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import torch
from torch import Tensor


@dataclass
class Conditioning:
    """The encoded prompts of a batch, one row per prompt (and, for editing or image-to-video, its images).

    The conditional side is ``embeds [B, L, D]``, ``pooled [B, P]`` (None where a family has no pooled embedding) and
    ``extra``, any further per-row tensors a family's denoiser reads (attention masks, text position ids); the
    unconditional side of classifier-free guidance is ``null_embeds``, ``null_pooled`` and ``null_extra`` (None /
    empty without CFG). ``shared`` holds per-row tensors both sides see, such as an edit's source-image latents or
    a video's first frame: encoded once per prompt and shared by its group and its tree. Every tensor is indexed by
    row, so :meth:`select` picks rows of all of them; a policy pads both sides of a batch to one length so that
    the two can run as one batch.
    """

    embeds: Tensor
    pooled: Optional[Tensor] = None
    null_embeds: Optional[Tensor] = None
    null_pooled: Optional[Tensor] = None
    extra: dict[str, Tensor] = field(default_factory=dict)
    null_extra: dict[str, Tensor] = field(default_factory=dict)
    shared: dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.embeds)

    @property
    def guided(self) -> bool:
        """Whether there is an unconditional side (classifier-free guidance can run)."""
        return self.null_embeds is not None

    def select(self, index: Tensor | Sequence[int]) -> "Conditioning":
        """The rows ``index`` of every field.

        >>> c = Conditioning(torch.arange(3.0)[:, None], extra={"mask": torch.tensor([1, 0, 1])})
        >>> c.select([2, 0]).extra["mask"].tolist()
        [1, 1]
        """
        index = torch.as_tensor(index, device=self.embeds.device, dtype=torch.long)
        if len(index) == len(self) and torch.equal(index.cpu(), torch.arange(len(self))):
            return self  # every row, in order: nothing to copy
        pick = lambda t: None if t is None else t[index.to(t.device)]  # noqa: E731
        rows = lambda d: {k: pick(v) for k, v in d.items()}  # noqa: E731
        return replace(self, embeds=pick(self.embeds), pooled=pick(self.pooled), null_embeds=pick(self.null_embeds),
                       null_pooled=pick(self.null_pooled), extra=rows(self.extra), null_extra=rows(self.null_extra),
                       shared=rows(self.shared))

    def conditional(self) -> "Conditioning":
        """The conditional side alone (what one unguided evaluation reads)."""
        return Conditioning(self.embeds, self.pooled, extra=self.extra, shared=self.shared)

    def unconditional(self) -> "Conditioning":
        """The unconditional side as a conditioning of its own (its rows are the same prompts' negatives)."""
        if not self.guided:
            raise ValueError("this conditioning has no unconditional side (a guidance-distilled model's encoding)")
        return Conditioning(self.null_embeds, self.null_pooled, extra=self.null_extra, shared=self.shared)

    @staticmethod
    def cat(parts: Sequence["Conditioning"]) -> "Conditioning":
        """One-sided conditionings' rows concatenated (both CFG sides as one batch).

        >>> Conditioning.cat([Conditioning(torch.zeros(1, 2)), Conditioning(torch.ones(2, 2))]).embeds.shape
        torch.Size([3, 2])
        """
        join = lambda ts: None if ts[0] is None else torch.cat(ts)  # noqa: E731
        keys = lambda name: getattr(parts[0], name).keys()  # noqa: E731
        return Conditioning(join([p.embeds for p in parts]), join([p.pooled for p in parts]),
                            extra={k: torch.cat([p.extra[k] for p in parts]) for k in keys("extra")},
                            shared={k: torch.cat([p.shared[k] for p in parts]) for k in keys("shared")})
