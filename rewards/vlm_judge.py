"""A vision-language model as judge, over an OpenAI-compatible ``/v1/chat/completions`` server (vLLM, SGLang, TGI,
or a hosted API): UnifiedReward-style scoring (arXiv 2503.05236), as Flow-GRPO's ``unifiedreward_score_sglang``.

Each image is sent as one chat request: a user message holding the image (a base64 PNG ``data:`` URL) and a rubric
that quotes the prompt and asks for ``Final Score: <number>``. A video is sent as one frame strip (``video:
strip``, the default): the frames ``frames`` picks (first, middle, last by default), each resized to ``image_size``,
side by side in time order, with ``video_template``'s rubric; ``video: frames`` judges each picked frame as an
image and reduces their scores (:mod:`flowrl.rewards.video_frames`). The score is the number after the **last**
``Final Score:`` of the reply (``score_pattern``, a regex whose first group is the number), divided by
``max_score``: UnifiedReward's 1..5 becomes 0.2..1. A reply without a score, or with one outside
``[0, max_score]``, is an error that quotes the reply (Flow-GRPO scores it 0, which trains on a parser failure).

Edits (``edit: true``): each request carries the row's source images (``metadata["images"]``, see
:mod:`flowrl.rewards.edit_sources`), then the edited image, each as its own image part, with ``edit_template``'s
rubric quoting the instruction; a batch without source images is refused with the fix.

Transport: ``requests`` with urllib3's ``Retry``: refused connections, timeouts and 429/5xx answers are retried
``retries`` times with exponential backoff; any other 4xx fails at once; the final error names the URL. Up to
``max_concurrency`` requests are in flight at once.
"""

from __future__ import annotations

import base64
import io
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional
from urllib.parse import urlparse

import requests
import torch
from PIL import Image
from requests.adapters import HTTPAdapter
from torch import Tensor
from urllib3.util.retry import Retry

from flowrl.rewards.base import RewardCallback
from flowrl.rewards.edit_sources import sources
from flowrl.rewards.pil_images import to_pil
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec, frame_indices

# UnifiedReward's image-generation rubric, as Flow-GRPO sends it (there prefixed by "<image>\n" for SGLang's
# chatml-llava template; here the image travels as an image_url part, so the placeholder is left out)
UNIFIED_REWARD_TEMPLATE = (
    "You are given a text caption and a generated image based on that caption. Your task is to evaluate this image "
    "based on two key criteria:\n"
    "1. Alignment with the Caption: Assess how well this image aligns with the provided caption. Consider the "
    "accuracy of depicted objects, their relationships, and attributes as described in the caption.\n"
    "2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail preservation, "
    "color accuracy, and overall aesthetic appeal.\n"
    "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\nText Caption: [{prompt}]")
# the same rubric for a strip of video frames (flowrl's wording; its last line is the image rubric's)
UNIFIED_REWARD_STRIP_TEMPLATE = (
    "You are given a text caption and frames of a video generated from it, shown side by side from left to right "
    "in time order. Your task is to evaluate this video based on three key criteria:\n"
    "1. Alignment with the Caption: Assess how well the video aligns with the provided caption. Consider the "
    "accuracy of depicted objects, their relationships, attributes and actions as described in the caption.\n"
    "2. Overall Visual Quality: Examine the visual quality of the frames, including clarity, detail preservation, "
    "color accuracy, and overall aesthetic appeal.\n"
    "3. Temporal Consistency: Check that objects, scene and style stay coherent from frame to frame.\n"
    "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\nText Caption: [{prompt}]")
# an edit's rubric (flowrl's wording, on UnifiedReward's pattern): the sources come first, the edited image last
EDIT_TEMPLATE = (
    "You are given one or more source images followed by an edited image, the last one, made from them by following "
    "an editing instruction. Your task is to evaluate the edited image based on two key criteria:\n"
    "1. Instruction Following: Assess how completely and accurately the edit carries out the instruction.\n"
    "2. Consistency and Quality: Check that what the instruction does not ask to change is kept from the source "
    "(identity, layout, background, style), and that the result is clear and free of artifacts.\n"
    "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\nInstruction: [{prompt}]")
SCORE_PATTERN = r"Final Score:\s*\**\s*([-+]?\d+(?:\.\d+)?)"
RETRIED_STATUS = (429, 500, 502, 503, 504)


class VlmJudgeError(RuntimeError):
    """The judge could not be reached, or its reply held no usable score."""


def parse_score(reply: str, pattern: str = SCORE_PATTERN, max_score: float = 5.0) -> float:
    """The last score ``pattern`` finds in ``reply``, divided by ``max_score``.

    >>> parse_score("Alignment is good, quality fair.\\nFinal Score: 4.5")
    0.9
    >>> parse_score("Final Score: 2 ... on reflection, Final Score: **3**")
    0.6

    Raises:
        VlmJudgeError: no score in the reply, or one outside ``[0, max_score]``; the message quotes the reply.
    """
    matches = re.findall(pattern, reply)
    if not matches:
        raise VlmJudgeError(f"the judge's reply has no score matching {pattern!r}: {reply[:1000]!r}; adjust "
                            f"`score_pattern` or the rubric (`prompt_template`) so the reply ends with one")
    value = float(matches[-1][0] if isinstance(matches[-1], tuple) else matches[-1])
    if not 0 <= value <= max_score:
        raise VlmJudgeError(f"the judge's score {value} is outside [0, max_score={max_score}] in the reply "
                            f"{reply[:1000]!r}; set `max_score` to the rubric's maximum")
    return value / max_score


def png_data_url(image: Image.Image) -> str:
    """``data:image/png;base64,...`` for ``image``: lossless, so the judge sees the exact 8-bit pixels."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class VlmJudge(RewardCallback):
    """Scores from a VLM judge behind an OpenAI-compatible chat-completions server, in ``[0, 1]``.

    Args:
        url: the API base, e.g. ``http://127.0.0.1:17140/v1`` (requests go to ``<url>/chat/completions``).
        model: the model name the server serves (e.g. ``CodeGoat24/UnifiedReward-qwen-7b``).
        prompt_template: the rubric; ``{prompt}`` is replaced by the image's prompt.
        score_pattern: regex whose first group is the score. max_score: the rubric's maximum (divides the score).
        image_size: images are resized to ``image_size`` x ``image_size`` (bicubic) before sending, as Flow-GRPO's
            512; ``None`` sends them as they are.
        temperature, max_tokens: sampling settings sent with each request (``max_tokens`` only when set).
        api_key_env: the name of an environment variable holding the API key (sent as a Bearer token).
        timeout: seconds per request. retries: further attempts after a timeout, refused connection or 429/5xx.
        backoff: urllib3's backoff factor (seconds, doubling). max_concurrency: requests in flight.
        video: ``strip`` (a video's picked frames side by side, one request) or ``frames`` (each picked frame
            judged alone, the scores reduced). video_template: the strip's rubric (``{prompt}`` as above).
        edit: judge edits: the row's source images go before the edited image, with ``edit_template``.
        edit_template: the edit rubric (``{prompt}``: the instruction).
        weight, name, batch_size, frames, frame_reduction: as :class:`~flowrl.rewards.RewardCallback`.
    """

    default_name = "vlm_judge"

    def __init__(self, url: str, model: str, weight: float = 1.0, name: Optional[str] = None, batch_size: int = 64,
                 prompt_template: str = UNIFIED_REWARD_TEMPLATE, score_pattern: str = SCORE_PATTERN,
                 max_score: float = 5.0, image_size: Optional[int] = 512, temperature: float = 0.0,
                 max_tokens: Optional[int] = None, api_key_env: Optional[str] = None, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 0.5, max_concurrency: int = 8, video: str = "strip",
                 video_template: str = UNIFIED_REWARD_STRIP_TEMPLATE, edit: bool = False,
                 edit_template: str = EDIT_TEMPLATE, frames: FrameSpec = DEFAULT_FRAMES, frame_reduction: str = "mean"):
        super().__init__(weight, name, batch_size, frames, frame_reduction)
        problems = []
        if video not in ("strip", "frames"):
            problems.append(f"video={video!r}: choose strip (frames side by side) or frames (each judged alone)")
        if "{prompt}" not in video_template:
            problems.append("video_template must contain '{prompt}' where the video's prompt goes")
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            problems.append(f"url={url!r} must look like http://host:port/v1")
        if "{prompt}" not in prompt_template:
            problems.append("prompt_template must contain '{prompt}' where the image's prompt goes")
        if edit and "{prompt}" not in edit_template:
            problems.append("edit_template must contain '{prompt}' where the edit instruction goes")
        try:
            if re.compile(score_pattern).groups < 1:
                problems.append(f"score_pattern={score_pattern!r} needs a group around the number")
        except re.error as err:
            problems.append(f"score_pattern={score_pattern!r} is not a regex: {err}")
        if max_score <= 0 or timeout <= 0 or retries < 0 or backoff < 0 or max_concurrency < 1:
            problems.append(f"max_score={max_score} and timeout={timeout} must be > 0, retries={retries} and "
                            f"backoff={backoff} >= 0, max_concurrency={max_concurrency} >= 1")
        if image_size is not None and image_size < 1:
            problems.append(f"image_size={image_size} must be positive or null")
        if api_key_env is not None and not os.environ.get(api_key_env):
            problems.append(f"api_key_env={api_key_env!r}: that environment variable is not set")
        if problems:
            raise ValueError(f"VlmJudge {self.name!r}: " + "; ".join(problems))
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model, self.prompt_template = model, prompt_template
        self.score_pattern, self.max_score = score_pattern, max_score
        self.image_size, self.temperature, self.max_tokens = image_size, temperature, max_tokens
        self.api_key_env, self.timeout, self.retries, self.backoff = api_key_env, timeout, retries, backoff
        self.max_concurrency, self.video, self.video_template = max_concurrency, video, video_template
        self.edit, self.edit_template = edit, edit_template

    @property
    def takes_clips(self) -> bool:
        """A strip judges the whole clip; ``video: frames`` leaves the frames to the base class's reduction."""
        return self.video == "strip"

    def _session(self) -> requests.Session:
        retry = Retry(total=self.retries, connect=self.retries, read=self.retries, status=self.retries,
                      backoff_factor=self.backoff, status_forcelist=RETRIED_STATUS, allowed_methods=None)
        session = requests.Session()
        session.mount("http://", HTTPAdapter(max_retries=retry, pool_maxsize=self.max_concurrency))
        session.mount("https://", HTTPAdapter(max_retries=retry, pool_maxsize=self.max_concurrency))
        if self.api_key_env is not None:
            session.headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        return session

    def request_body(self, image: Image.Image, prompt: str, strip: bool = False,
                     sources: Optional[list[Image.Image]] = None) -> dict[str, Any]:
        """The chat-completions request for one image, a frame strip (already sized) with the video rubric, or an
        edit: its ``sources`` then the edited image, with the edit rubric."""
        pictures = [*(sources or []), image]
        if self.image_size is not None and not strip:
            pictures = [p.resize((self.image_size, self.image_size), Image.BICUBIC) for p in pictures]
        template = self.video_template if strip else self.edit_template if sources is not None else \
            self.prompt_template
        content = [*({"type": "image_url", "image_url": {"url": png_data_url(p)}} for p in pictures),
                   {"type": "text", "text": template.replace("{prompt}", prompt)}]
        body = {"model": self.model, "messages": [{"role": "user", "content": content}],
                "temperature": self.temperature}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def frame_strip(self, clip: Tensor) -> Image.Image:
        """The frames ``frames`` picks from ``clip [F, 3, H, W]``, each resized to ``image_size`` (bicubic), side by
        side left to right."""
        pictures = to_pil(clip[frame_indices(self.frames, clip.shape[0])])
        if self.image_size is not None:
            pictures = [p.resize((self.image_size, self.image_size), Image.BICUBIC) for p in pictures]
        strip = Image.new("RGB", (sum(p.width for p in pictures), max(p.height for p in pictures)))
        for i, picture in enumerate(pictures):
            strip.paste(picture, (sum(p.width for p in pictures[:i]), 0))
        return strip

    def judge(self, session: requests.Session, image: Image.Image, prompt: str, strip: bool = False,
              sources: Optional[list[Image.Image]] = None) -> str:
        """The judge's reply text for one image, frame strip or edit."""
        try:
            response = session.post(self.endpoint, json=self.request_body(image, prompt, strip, sources),
                                    timeout=self.timeout)
        except requests.RequestException as err:
            raise VlmJudgeError(f"VLM judge {self.endpoint} did not answer after {self.retries + 1} attempts "
                                f"(timeout {self.timeout}s each): {err}") from err
        if response.status_code != 200:
            raise VlmJudgeError(f"VLM judge {self.endpoint} answered {response.status_code}: {response.text[:500]}")
        try:
            return response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise VlmJudgeError(f"VLM judge {self.endpoint} sent no chat completion (choices[0].message.content): "
                                f"{response.text[:500]}") from err

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        strip = images.ndim == 5 and images.shape[1] > 1  # clips (a one-frame clip is an image)
        if self.edit and strip:
            raise ValueError(f"reward {self.name!r} judges edits of images; videos go without edit: true")
        pictures = [self.frame_strip(clip) for clip in images] if strip else to_pil(images.flatten(0, -4))
        edits = ([[to_pil(s[None])[0] for s in row] for row in sources(metadata, len(prompts), self.name)]
                 if self.edit else [None] * len(prompts))
        with self._session() as session, ThreadPoolExecutor(min(self.max_concurrency, len(prompts))) as pool:
            replies = list(pool.map(lambda row: self.judge(session, row[0], row[1], strip, row[2]),
                                    zip(pictures, prompts, edits)))
        return torch.tensor([parse_score(r, self.score_pattern, self.max_score) for r in replies],
                            dtype=torch.float32)
