"""A reward that cannot score what the policy makes is named before any weight loads (the CLI's gathered problems):
a source index past the prompt records' source images on an editing policy, frames past a video policy's clip. The
text-to-image cases (an edit reward, a reward of clips, a missing reward model) are in tests/cli/test_config_errors.py."""

from pathlib import Path

import pytest

from flowrl.cli import main
from tests.policies.edit_records import write_records
from tests.policies.test_edit_fits import edit_args

ROOT = Path(__file__).resolve().parents[2]


def fails(args: list[str]) -> str:
    with pytest.raises(SystemExit) as err:
        main(args)
    return str(err.value)


def test_a_source_index_past_the_records_sources_fails_before_loading(flux_kontext_dir, tmp_path, refuse_weights):
    records = write_records(tmp_path / "data")  # one source image per record
    for index in (1, -2):
        message = fails(edit_args("kontext", flux_kontext_dir, tmp_path / "run", records,
                                  f"--trainer.callbacks.source_index={index}"))
        assert (f"trainer.callbacks: EditConsistency source_index={index} is past the 1 source images of "
                f"data.prompts={records} line 1 (3 records have too few); set source_index to an image every record "
                "has (0: the first, -1: the last)") in message, message


def nine_frames(wan_dirs, tmp_path, *options: str) -> list[str]:
    """The shipped Wan 2.1 config on the tiny Wan at 9 frames, with ``options``."""
    return ["fit", "--config", str(ROOT / "configs/wan21_flow_grpo.yaml"), "--data.prompts=[a cat, a dog]",
            f"--model.init_args.policy.init_args.model={wan_dirs['wan21']}", f"--trainer.default_root_dir={tmp_path}",
            "--model.init_args.policy.init_args.num_frames=9", *options]


def test_frames_past_the_video_policys_clip_fail_before_loading(wan_dirs, tmp_path, refuse_weights):
    message = fails(nine_frames(wan_dirs, tmp_path, "--trainer.callbacks+=flowrl.rewards.JpegIncompressibility",
                                "--trainer.callbacks.frames=[0, 12]"))
    assert ("trainer.callbacks: JpegIncompressibility frames=[0, 12]: indices [12] are outside a clip of 9 frames "
            "(model.init_args.policy.init_args.num_frames=9); pick frames in [-9, 9)") in message, message
    # a reward that compares neighbouring frames, given one
    message = fails(nine_frames(wan_dirs, tmp_path, "--trainer.callbacks+=flowrl.rewards.TemporalConsistency",
                                "--trainer.callbacks.frames=first"))
    assert ("trainer.callbacks: TemporalConsistency frames='first' picks 1 of the clip's 9 frames; it compares at "
            "least 2") in message, message
