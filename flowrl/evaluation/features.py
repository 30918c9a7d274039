"""The feature space in which drift and diversity are measured besides pixels: a reward model's view of an image.

A reward callback that has ``image_features(images [B, 3, H, W]) -> [B, D]`` provides one:
:class:`~flowrl.rewards.DigitAlignment` (the digit classifier's penultimate features) and every CLIP-backed reward
(PickScore, HPSv2, CLIPScore, Aesthetic: the unit-norm image embedding). Your own reward provides one by defining the
method. ``--features`` picks it: ``auto`` (the first metric that has one), a metric's name, or ``none``.
"""

from __future__ import annotations

from typing import Optional

from flowrl.rewards.base import RewardCallback


def has_features(reward: RewardCallback) -> bool:
    return callable(getattr(reward, "image_features", None))


def feature_problems(option: str, rewards: list[RewardCallback]) -> list[str]:
    """``--features`` that names no metric with image features.

    >>> from flowrl.rewards import JpegCompressibility
    >>> print(*feature_problems("jpeg_compressibility", [JpegCompressibility()]))  # doctest: +ELLIPSIS
    --features jpeg_compressibility: that metric has no image_features(images) method; give auto, none, or one of ...
    """
    if option in ("auto", "none"):
        return []
    named = {r.name: r for r in rewards}
    if option not in named:
        return [f"--features {option}: no metric of that name; give auto, none, or one of {sorted(named)}"]
    if not has_features(named[option]):
        providers = [r.name for r in rewards if has_features(r)]
        return [f"--features {option}: that metric has no image_features(images) method; give auto, none, or one of "
                f"{providers or 'the metrics that have one (DigitAlignment, the CLIP rewards)'}"]
    return []


def feature_reward(option: str, rewards: list[RewardCallback]) -> Optional[RewardCallback]:
    """The reward whose ``image_features`` define the feature space (None: pixels only)."""
    if option == "none":
        return None
    if option == "auto":
        return next((r for r in rewards if has_features(r)), None)
    return next(r for r in rewards if r.name == option)
