"""VideoScore2 (He et al. 2025, arXiv 2509.22799): a Qwen2.5-VL-7B that reasons about a generated video, then writes
three 1-5 scores: visual quality (VQ), text-to-video alignment (TA), physical/common-sense consistency (PC).

As the authors' inference script on the model card (huggingface.co/TIGER-Lab/VideoScore2, ``vs2_inference.py`` of
github.com/TIGER-AI-Lab/VideoScore2; read here through a copy in the public index, the repository itself could not
be fetched) does it:

- **frames**: ``qwen_vl_utils`` at ``fps`` 2.0 (:mod:`flowrl.rewards.qwen_video`: at least 4 frames, an even count,
  between 128 and 768 x 28 x 28 pixels each), ``second_per_grid_ts = 2 / fps`` for the time positions;
- **prompt**: :data:`QUERY_TEMPLATE` with the video's prompt, one user turn (video, then text), the generation
  prompt; generation with sampling at ``temperature`` 0.7, up to ``max_new_tokens`` 1024;
- **scores**: the hard scores are the three numbers :data:`SCORE_PATTERN` finds in the reply; the expected score of
  a dimension is ``sum_d d * p(d)`` over the digits 1-5 at the token where the reply writes that dimension's score
  (``p`` from the generation's processed logits, renormalised over the five digits; :func:`expected_scores`).

Each dimension (``VQ``, ``TA``, ``PC``, or ``mean`` of the three) is one reward callback, weighted in the YAML;
callbacks on one model share its weights and its generation (:mod:`flowrl.rewards.shared_judge`). ``score:
expected`` (default) or ``hard``. Where flowrl differs: a reply without the scores gives NaN (the sample is dropped
as invalid, not scored 0); ``temperature: 0`` generates greedily; frames are clip pixels at ``clip_fps``; the batch is
generated together (left-padded) rather than one video at a time.
"""

from __future__ import annotations

import re
from string import Template
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.model_paths import resolve_model
from flowrl.rewards.qwen_video import (VIDEO_MIN_PIXELS, VideoPatching, frame_size, resize_frames, sampled_frames,
                                       video_batch)
from flowrl.rewards.shared_judge import SharedJudge

QUERY_TEMPLATE = Template("""
You are an expert for evaluating AI-generated videos from three dimensions:
(1) visual quality - clarity, smoothness, artifacts;
(2) text-to-video alignment - fidelity to the prompt;
(3) physical/common-sense consistency - naturalness and physics plausibility.

Video prompt: $t2v_prompt

Please output in this format:
visual quality: <v_score>;
text-to-video alignment: <t_score>,
physical/common-sense consistency: <p_score>
""")
SCORE_PATTERN = re.compile(r"visual quality[^:]*:\s*(\d+).*?text-to-video alignment[^:]*:\s*(\d+).*?"
                           r"physical/common-sense consistency[^:]*:\s*(\d+)", re.DOTALL | re.IGNORECASE)
#: dimension -> the label its score follows in the reply
LABELS = {"VQ": "visual quality", "TA": "text-to-video alignment", "PC": "physical/common-sense consistency"}


def hard_scores(reply: str) -> dict[str, float]:
    """The three scores the reply writes (NaN each when it does not write them in order).

    >>> hard_scores("<think>...</think>(1) visual quality: 4;\\n(2) text-to-video alignment: 3,\\n"
    ...             "(3) physical/common-sense consistency: 5")
    {'VQ': 4.0, 'TA': 3.0, 'PC': 5.0}
    >>> hard_scores("I cannot judge this video.")
    {'VQ': nan, 'TA': nan, 'PC': nan}
    """
    match = SCORE_PATTERN.search(reply)
    return {d: float(match.group(i + 1)) if match else float("nan") for i, d in enumerate(LABELS)}


def score_positions(reply_ids: list[int], tokenizer) -> dict[str, Optional[int]]:
    """For each dimension, the index of the generated token that completes the first digit after the first
    ``<label>...:`` of the reply (the authors' ``_find_score_token_index_by_prompt``), or None."""
    text = tokenizer.decode(reply_ids, skip_special_tokens=False)
    out: dict[str, Optional[int]] = {}
    for dimension, label in LABELS.items():
        found = re.search(r"(?:\(\d+\)\s*|\n\s*)?" + re.escape(label) + r"[^:]*:", text, flags=re.IGNORECASE)
        digit = re.search(r"\d", text[found.end():]) if found else None
        out[dimension] = None if digit is None else _token_ending_at(
            reply_ids, tokenizer, text[:found.end() + digit.start() + 1])
    return out


def _token_ending_at(ids: list[int], tokenizer, prefix: str) -> Optional[int]:
    """The token ``i`` whose decoded ``ids[:i + 1]`` is exactly ``prefix`` (binary search: decoded prefixes only grow)."""
    low, high = 0, len(ids) - 1
    while low < high:
        mid = (low + high) // 2
        if len(tokenizer.decode(ids[:mid + 1], skip_special_tokens=False)) < len(prefix):
            low = mid + 1
        else:
            high = mid
    return low if ids and tokenizer.decode(ids[:low + 1], skip_special_tokens=False) == prefix else None


def expected_scores(step_logits: Tensor, positions: dict[str, Optional[int]], digit_ids: list[int]) -> dict[str, float]:
    """``sum_d d * p(d)`` over the digits 1-5 at each dimension's score token, ``p`` the softmax of the processed
    logits ``[T, V]`` renormalised over the five digit tokens (``digit_ids``: the ids of ``"1"`` .. ``"5"``); NaN
    where the reply has no score token.

    >>> logits = torch.full((2, 6), -1e9)
    >>> logits[1, 1:6] = torch.log(torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0]) + 1e-30)  # p(3) = p(4) = 0.5
    >>> expected_scores(logits, {"VQ": 1, "TA": None}, [1, 2, 3, 4, 5])
    {'VQ': 3.5, 'TA': nan}
    """
    values = torch.arange(1, 6, dtype=torch.float64)
    out = {}
    for dimension, position in positions.items():
        if position is None:
            out[dimension] = float("nan")
            continue
        probs = torch.softmax(step_logits[position].double(), dim=-1)[digit_ids]
        out[dimension] = float((values * probs).sum() / probs.sum())
    return out


class VideoScore2(SharedJudge):
    """One dimension of VideoScore2 (see the module docstring).

    Args:
        model: the model folder or hub id (``TIGER-Lab/VideoScore2``), a ``Qwen2_5_VLForConditionalGeneration``.
        dimension: ``VQ``, ``TA``, ``PC`` or ``mean`` (of the three). name: default ``videoscore2_<dimension>``.
        score: ``expected`` (digit probabilities at the score token) or ``hard`` (the written number).
        clip_fps: the frame rate of the generated clips (Wan: 16). fps: frames per second read (2.0).
        min_pixels, max_pixels: per-frame pixel bounds (``qwen_vl_utils``' 128 and 768 x 28 x 28).
        temperature: sampling temperature (the authors' 0.7; 0: greedy). max_new_tokens: reply budget (1024).
        weight, batch_size (clips generated together), device, dtype: as :class:`~flowrl.rewards.ModelReward`.
    """

    default_name = "videoscore2"
    dimensions = (*LABELS, "mean")

    def __init__(self, model: str = "TIGER-Lab/VideoScore2", dimension: str = "mean", weight: float = 1.0,
                 name: Optional[str] = None, batch_size: int = 4, score: str = "expected", clip_fps: float = 16.0,
                 fps: float = 2.0, min_pixels: int = VIDEO_MIN_PIXELS, max_pixels: int = 768 * 28 * 28,
                 temperature: float = 0.7, max_new_tokens: int = 1024, device: Optional[str] = None,
                 dtype: str = "bfloat16"):
        super().__init__(resolve_model(model), dimension, weight, name, batch_size, device, dtype)
        problems = []
        if score not in ("expected", "hard"):
            problems.append(f"score={score!r}: choose expected or hard")
        if clip_fps <= 0 or fps <= 0 or temperature < 0 or max_new_tokens < 1 or not 0 < min_pixels <= max_pixels:
            problems.append(f"clip_fps={clip_fps} and fps={fps} must be > 0, temperature={temperature} >= 0, "
                            f"max_new_tokens={max_new_tokens} >= 1, 0 < min_pixels={min_pixels} <= "
                            f"max_pixels={max_pixels}")
        if problems:
            raise ValueError(f"VideoScore2 {self.name!r}: " + "; ".join(problems))
        self.score_kind, self.clip_fps, self.fps = score, clip_fps, fps
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.options = (score, clip_fps, fps, min_pixels, max_pixels, temperature, max_new_tokens)

    def _load(self, model: str, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        tokenizer = AutoTokenizer.from_pretrained(model)
        if not tokenizer.chat_template:
            raise ValueError(f"VideoScore2 {model!r}: its tokenizer has no chat template; pass the model folder the "
                             "authors published (TIGER-Lab/VideoScore2)")
        net = Qwen2_5_VLForConditionalGeneration.from_pretrained(model, dtype=dtype)
        digit_ids = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(1, 6)]
        if any(len(ids) != 1 for ids in digit_ids):
            raise ValueError(f"VideoScore2 {model!r}: the digits 1-5 are not single tokens of its tokenizer")
        return {"net": net.eval().requires_grad_(False).to(device), "tokenizer": tokenizer,
                "patching": VideoPatching.from_pretrained(model), "digit_ids": [ids[0] for ids in digit_ids]}

    def clip_pixels(self, clip: Tensor) -> Tensor:
        """``clip [F, 3, H, W]`` in ``[0, 1]`` -> the sampled, resized frames ``[n, 3, h, w]`` in ``[0, 255]``."""
        picked = sampled_frames(clip.shape[0], self.clip_fps, self.fps)
        size = frame_size(*clip.shape[-2:], min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return resize_frames(clip[picked].cpu(), size)

    def generate(self, clips: Tensor, prompts: list[str]):
        """The judge's replies: ``generate``'s output (``sequences`` after the prompt, processed ``scores``)."""
        device = self.model_device  # loads the judge on first use
        judge = self.model
        texts = [judge["tokenizer"].apply_chat_template(
            [{"role": "user", "content": [{"type": "video"},
                                          {"type": "text", "text": QUERY_TEMPLATE.substitute(t2v_prompt=p)}]}],
            tokenize=False, add_generation_prompt=True) for p in prompts]
        batch = video_batch([self.clip_pixels(c) for c in clips], texts, judge["tokenizer"], judge["patching"], "left",
                            fps=self.fps)
        batch = {k: v.to(device) for k, v in batch.items()}
        batch["pixel_values_videos"] = batch["pixel_values_videos"].to(self.dtype)
        sampling = {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else {
            "do_sample": False}
        out = judge["net"].generate(**batch, max_new_tokens=self.max_new_tokens, output_scores=True,
                                    return_dict_in_generate=True, **sampling)
        return out, batch["input_ids"].shape[1]

    def _judge(self, clips: Tensor, prompts: list[str]) -> dict[str, Tensor]:
        judge = self.model
        out, start = self.generate(clips, prompts)
        logits = torch.stack(list(out.scores), dim=1)  # [B, T, V]
        rows = []
        for b, sequence in enumerate(out.sequences[:, start:].tolist()):
            reply_ids = _strip_padding(sequence, judge["tokenizer"].pad_token_id)
            reply = judge["tokenizer"].decode(reply_ids, skip_special_tokens=True)
            if self.score_kind == "hard":
                rows.append(hard_scores(reply))
                continue
            hard = hard_scores(reply)  # no scores written: NaN, whatever the probabilities at a stray digit
            soft = expected_scores(logits[b], score_positions(reply_ids, judge["tokenizer"]), judge["digit_ids"])
            rows.append({d: soft[d] if hard[d] == hard[d] else float("nan") for d in LABELS})
        scores = {d: torch.tensor([row[d] for row in rows]) for d in LABELS}
        return {**scores, "mean": torch.stack(list(scores.values())).mean(0)}


def _strip_padding(ids: list[int], pad: Optional[int]) -> list[int]:
    """A generated row without the padding after its end (rows of a batch end at different steps)."""
    while ids and pad is not None and ids[-1] == pad:
        ids = ids[:-1]
    return ids
