"""Whether the run's rewards can score what its policy makes, known from the built objects before any weight loads
(each reward's own ``config_problems`` sees only its own arguments): a reward that compares with source images on a
policy that takes none, a source index past the records' sources, a reward of clips on a policy of single images,
frames past the clip. A reward's local model folder that is not there is read off the parsed config
(:func:`reward_model_problems`): several rewards resolve it when built, so that one is refused before it exists. On
a real model each would otherwise cost the weight load and a rollout, then a traceback from inside the reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from flowrl.config_nodes import as_dict, class_at, with_defaults
from flowrl.model_paths import resolve_model
from flowrl.prompt_records import data_sources, load_records

EDITING = "an editing policy (flowrl.policies.FluxKontextPolicy, QwenImageEditPolicy) on prompt records with \"images\""


def reward_policy_problems(callbacks: list, policy: Any, data: Any) -> list[str]:
    """Every reward among the trainer's built ``callbacks`` against the built ``policy`` (or the CLI's stand-in for
    one that could not be built) and the prompt records of the data module ``data``, each problem naming the reward,
    its key and the fix."""
    from flowrl.rewards.base import RewardCallback

    return [f"trainer.callbacks: {type(reward).__name__} {p}" for reward in callbacks
            if isinstance(reward, RewardCallback) for p in one_reward_problems(reward, policy, data_sources(data))]


def one_reward_problems(reward: Any, policy: Any, sources: Mapping[str, Any]) -> list[str]:
    """One built reward against the policy (``sources``: the data module's prompt sources by key)."""
    name, problems = type(policy).__name__, []
    num_frames, conditioning = getattr(policy, "num_frames", None), getattr(policy, "conditioning_images", 0)
    min_frames = getattr(reward, "min_frames", 1)
    if hasattr(reward, "source_index") and not conditioning:
        problems.append(f"compares each sample with its prompt record's source image, but {name} makes images from "
                        f"text alone; train {EDITING}, or remove the reward")
    elif hasattr(reward, "source_index"):
        problems += source_index_problems(reward.source_index, sources)
    if min_frames > 1 and num_frames is None:  # takes_clips alone: an image is a one-frame clip
        problems.append(f"compares frames of a clip (at least {min_frames}), but {name} makes single images; use "
                        "it with a video policy (flowrl.policies.WanPolicy), or remove the reward")
    frames = getattr(reward, "frames", None)
    if num_frames is not None and isinstance(frames, (list, tuple, str)):
        from flowrl.rewards.video_frames import frame_indices

        try:
            picked = len(frame_indices(frames, num_frames))
        except (ValueError, KeyError) as err:  # a misspelled selection (KeyError) is the reward's own check
            picked = None
            if isinstance(err, ValueError):
                problems.append(f"{err} (model.init_args.policy.init_args.num_frames={num_frames}); pick frames in "
                                f"[-{num_frames}, {num_frames}), or a named selection such as first_middle_last")
        if picked is not None and picked < min_frames:
            problems.append(f"frames={frames!r} picks {picked} of the clip's {num_frames} frames; it compares at "
                            f"least {min_frames}: pick more (all, every_4, or a list)")
    return problems


def reward_model_problems(config: Any) -> list[str]:
    """The local model folder of each reward in the parsed ``trainer.callbacks`` (its ``model``, the declared
    default where unset) that is not there. Read off the config: DigitAlignment, ClipReward and ImageReward resolve
    the folder when built and refuse to build without it."""
    from flowrl.rewards.base import RewardCallback

    problems = []
    for node in map(as_dict, config.get("trainer", {}).get("callbacks") or []):
        cls = class_at(node.get("class_path"))
        if isinstance(cls, type) and issubclass(cls, RewardCallback):
            model = with_defaults(cls, node.get("init_args")).get("model")
            try:
                resolve_model(model) if isinstance(model, str) else None
            except FileNotFoundError as err:
                problems.append(f"trainer.callbacks: {cls.__name__} model={model!r}: {err}")
    return problems


def source_index_problems(index: int, sources: Mapping[str, Any]) -> list[str]:
    """``source_index`` against the source images of every record of the ``prompts`` / ``val_prompts`` sources
    (``-n <= index < n`` for a record of ``n``); the first record of each source that has too few is named."""
    problems = []
    for key in ("prompts", "val_prompts"):
        source = sources.get(key)
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
