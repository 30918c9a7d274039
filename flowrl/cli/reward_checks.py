"""Whether the config's rewards can score what its policy makes, known from the parsed config alone (each reward's
own ``config_problems`` sees only its own arguments): a reward that compares with source images on a policy that
takes none, a source index past the records' sources, a reward of clips on a policy of single images, frames past
the clip, a reward's local model folder that is not there. On a real model each would otherwise cost the weight load
and a rollout, then a traceback from inside the reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.config_nodes import as_dict, class_at, with_defaults
from flowrl.model_paths import resolve_model
from flowrl.prompt_records import load_records

EDITING = "an editing policy (flowrl.policies.FluxKontextPolicy, QwenImageEditPolicy) on prompt records with \"images\""


def reward_policy_problems(config: Any) -> list[str]:
    """Every reward of ``trainer.callbacks`` against ``model.init_args.policy`` and the prompt records of ``data``,
    each problem naming the reward, its key and the fix."""
    from flowrl.rewards.base import RewardCallback

    policy = as_dict(as_dict(as_dict(config.get("model")).get("init_args")).get("policy"))
    policy_cls = class_at(policy.get("class_path"))
    if not isinstance(policy_cls, type):
        return []
    options = with_defaults(policy_cls, policy.get("init_args"))
    problems = []
    for node in map(as_dict, config.get("trainer", {}).get("callbacks") or []):
        cls = class_at(node.get("class_path"))
        if isinstance(cls, type) and issubclass(cls, RewardCallback):
            reward = with_defaults(cls, node.get("init_args"))
            problems += [f"trainer.callbacks: {cls.__name__} {p}" for p in
                         one_reward_problems(cls, reward, policy_cls, options, as_dict(config.get("data")))]
    return problems


def one_reward_problems(cls: type, reward: dict, policy_cls: type, policy: dict, data: dict) -> list[str]:
    """One reward (its class and every option) against the policy (its class and every option)."""
    name, problems = policy_cls.__name__, []
    video, sources = "num_frames" in policy, getattr(policy_cls, "conditioning_images", 0)
    if "source_index" in reward and not sources:
        problems.append(f"compares each sample with its prompt record's source image, but {name} makes images from "
                        f"text alone; train {EDITING}, or remove the reward")
    elif "source_index" in reward:
        problems += source_index_problems(reward["source_index"], data)
    if getattr(cls, "min_frames", 1) > 1 and not video:  # takes_clips alone: an image is a one-frame clip
        problems.append(f"compares frames of a clip (at least {cls.min_frames}), but {name} makes single images; use "
                        "it with a video policy (flowrl.policies.WanPolicy), or remove the reward")
    if video and isinstance(reward.get("frames"), (list, tuple, str)):
        from flowrl.rewards.video_frames import frame_indices

        num_frames = policy["num_frames"]
        try:
            picked = len(frame_indices(reward["frames"], num_frames))
        except (ValueError, KeyError) as err:  # a misspelled selection (KeyError) is the reward's own check
            picked = None
            if isinstance(err, ValueError):
                problems.append(f"{err} (model.init_args.policy.init_args.num_frames={num_frames}); pick frames in "
                                f"[-{num_frames}, {num_frames}), or a named selection such as first_middle_last")
        if picked is not None and picked < getattr(cls, "min_frames", 1):
            problems.append(f"frames={reward['frames']!r} picks {picked} of the clip's {num_frames} frames; it compares "
                            f"at least {cls.min_frames}: pick more (all, every_4, or a list)")
    if isinstance(reward.get("model"), str):
        try:
            resolve_model(reward["model"])
        except FileNotFoundError as err:
            problems.append(f"model={reward['model']!r}: {err}")
    return problems


def source_index_problems(index: int, data: dict) -> list[str]:
    """``source_index`` against the source images of every record of ``data.prompts`` / ``data.val_prompts``
    (``-n <= index < n`` for a record of ``n``); the first record of each source that has too few is named."""
    problems = []
    for key in ("prompts", "val_prompts"):
        source = data.get(key)
        if not (isinstance(source, str) and source.endswith(".jsonl") and Path(source).expanduser().is_file()):
            continue  # missing or unreadable files are reported by the data checks
        try:
            short = [r for r in load_records(source) if not -len(r.images) <= index < len(r.images)]
        except (OSError, ValueError):
            continue
        if short:
            problems.append(f"source_index={index} is past the {len(short[0].images)} source images of data.{key}="
                            f"{source} line {short[0].line} ({len(short)} records have too few); set source_index to "
                            "an image every record has (0: the first, -1: the last)")
    return problems
