"""The learned video judges (VideoAlign's VideoReward, VideoScore2) on tiny random Qwen2-VL / Qwen2.5-VL saved as
their published folders: the authors' frame sampling, resize and patches on hand-checkable clips; each scores a tiny
clip through its real loading path; VideoReward's head, normalisation and Overall by hand, its LoRA checkpoint
merged by peft's formula; VideoScore2's reply parsing and expected score by hand; one judge shared by its dimensions;
a bad checkpoint folder refused before any weight loads."""

import doctest
from types import SimpleNamespace

import pytest
import torch

import flowrl.rewards.qwen_video as qwen_video
import flowrl.rewards.videoalign_checkpoint as videoalign_checkpoint
import flowrl.rewards.videoscore2 as videoscore2
from flowrl.rewards import VideoReward, VideoScore2
from flowrl.rewards.qwen_video import VideoPatching, frame_size, resize_frames, sampled_frames
from flowrl.rewards.shared_judge import _JUDGES
from tests.rewards.tiny_video_judges import (MAX_PIXELS, MIN_PIXELS, clip, qwen2_vl_base, qwen25_vl_judge,
                                             videoalign_folder)

TINY = {"dtype": "float32", "min_pixels": MIN_PIXELS}  # 28 x 56 frames stay 28 x 56
PROMPTS = ["a red cat", "a blue dog"]


@pytest.fixture(scope="module")
def judges(tmp_path_factory):
    root = tmp_path_factory.mktemp("judges")
    base = qwen2_vl_base(root / "qwen2_vl")
    yield SimpleNamespace(base=base, videoalign=videoalign_folder(root / "videoreward", base),
                          lora=videoalign_folder(root / "videoreward_lora", base, lora=True),
                          videoscore2=qwen25_vl_judge(root / "videoscore2"))
    _JUDGES.clear()


def clips(frames=9):
    return torch.stack([clip(frames, seed=0), clip(frames, seed=1)])  # [2, F, 3, 28, 56]


@pytest.mark.parametrize("module", [qwen_video, videoalign_checkpoint, videoscore2])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_frames_are_sampled_and_resized_as_qwen_vl_utils_does():
    # Wan's 81 frames at 16 fps, read at 2 fps: 81 / 16 * 2 = 10.125 -> 10 frames at linspace(0, 80, 10).round()
    assert sampled_frames(81, clip_fps=16, fps=2.0) == [round(80 * i / 9) for i in range(10)]
    # 33 frames: 4.125 -> 4 (frames 0, 10.67, 21.33, 32); 9 frames: 1.125 is below the minimum of 4 frames
    assert sampled_frames(33, 16, 2.0) == [0, 11, 21, 32] and sampled_frames(9, 16, 2.0) == [0, 3, 5, 8]
    assert sampled_frames(81, 16, None, nframes=6) == [0, 16, 32, 48, 64, 80]
    with pytest.raises(ValueError, match="at least 2"):
        sampled_frames(1, 16, 2.0)
    # 480 x 832 capped at VideoReward's 200,704 pixels: scale sqrt(480 * 832 / 200704) = 1.4106 -> 340.3 x 589.8,
    # floored to multiples of 28; 240 x 416 (Wan 2.1 1.3B) raised to at least 128 x 28 x 28 = 100,352 pixels
    assert frame_size(480, 832, max_pixels=200704) == (336, 588)
    assert frame_size(240, 416, max_pixels=200704) == (252, 420)  # 8.57 x 14.86 cells of 28 rounded: 9 x 15
    half = torch.full((2, 3, 28, 56), 0.5)
    assert torch.equal(resize_frames(half, (28, 56)), torch.full((2, 3, 28, 56), 128.0))  # 127.5 rounds to even 128
    assert torch.equal(resize_frames(half, (56, 112)), torch.full((2, 3, 56, 112), 128.0))  # a flat frame stays flat


def test_video_patches_are_the_image_processors_patches_on_a_still_clip():
    """A still 2-frame clip is one temporal patch of two equal frames: the layout the image processor gives an image
    (transformers' ``Qwen2VLImageProcessorPil.patchify`` broadcasts it over the temporal patch)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil()
    patching = VideoPatching(tuple(processor.image_mean), tuple(processor.image_std))
    frame = torch.randint(0, 256, (3, 56, 84)).float()
    patches, grid = patching.patchify(torch.stack([frame, frame]))
    normalised = ((frame / 255 - torch.tensor(patching.mean)[:, None, None]) / torch.tensor(patching.std)[:, None, None])
    want, gh, gw = processor.patchify(normalised.numpy(), patch_size=14, merge_size=2, temporal_patch_size=2)
    assert grid == [1, gh, gw] == [1, 4, 6] and patching.tokens_per_video(grid) == 6  # 24 patches / 2 x 2
    torch.testing.assert_close(patches, torch.from_numpy(want), rtol=0, atol=1e-6)
    odd, odd_grid = patching.patchify(torch.stack([frame, frame, frame]))  # an odd last frame is repeated
    assert odd_grid == [2, 4, 6] and torch.equal(odd[24:], patches)


def test_videoreward_scores_a_tiny_clip_from_its_checkpoint_folder(judges):
    rewards = {d: VideoReward(str(judges.videoalign), dimension=d, **TINY) for d in ("VQ", "MQ", "TA", "Overall")}
    scores = {d: r.score(clips(), PROMPTS) for d, r in rewards.items()}
    assert rewards["VQ"].name == "videoreward_vq" and all(s.shape == (2,) for s in scores.values())
    judge = rewards["VQ"].model
    assert all(r.model is judge for r in rewards.values())  # one judge for every dimension
    # the checkpoint's weights, every one (model.pth, transformers-4.45 keys) are the judge's
    saved = torch.load(judges.videoalign / "checkpoint-7" / "model.pth")
    loaded = videoalign_checkpoint.to_transformers4(judge["net"].state_dict())
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    # the head by hand: rm_head on the last hidden state at each special token, then (x - mean) / std
    raw = VideoReward(str(judges.videoalign), dimension="VQ", use_norm=False, name="raw", **TINY)  # a judge of its own
    texts = [judge["tokenizer"].apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": judge["template"].format(
            text_prompt=p)}]}], tokenize=False, add_generation_prompt=True) for p in PROMPTS]
    pixels = [rewards["VQ"].clip_pixels(c) for c in clips()]
    assert [p.shape for p in pixels] == [(4, 3, 28, 56)] * 2  # frames 0, 3, 5, 8 of 9 at 16 fps, read at 2 fps
    batch = qwen_video.video_batch(pixels, texts, judge["tokenizer"], judge["patching"], "right")
    hidden = judge["net"](**batch, output_hidden_states=True).hidden_states[-1]  # [B, L, 16]
    for b in range(2):
        at = [batch["input_ids"][b].tolist().index(i) for i in judge["special_ids"]]
        by_hand = hidden[b, at] @ judge["net"].rm_head.weight[0]  # [3]: VQ, MQ, TA
        torch.testing.assert_close(raw.score(clips(), PROMPTS)[b], by_hand[0])
        norm = torch.tensor([(by_hand[0] - 0.5) / 2.0, (by_hand[1] + 1.0) / 0.5, (by_hand[2] - 0.0) / 4.0])
        torch.testing.assert_close(torch.stack([scores[d][b] for d in ("VQ", "MQ", "TA")]), norm)
        torch.testing.assert_close(scores["Overall"][b], norm.sum())


def test_one_judge_pass_serves_every_dimension(judges, monkeypatch):
    rewards = [VideoReward(str(judges.videoalign), dimension=d, **TINY) for d in ("VQ", "MQ", "TA", "Overall")]
    net = rewards[0].load().model["net"]
    calls = []
    original = net.model.forward
    monkeypatch.setattr(net.model, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    video = clips() + 1e-3  # clips no earlier test scored
    [r.score(video, PROMPTS) for r in rewards]
    assert len(calls) == 1
    rewards[0].score(video.flip(0), PROMPTS)  # other clips: the judge runs again
    assert len(calls) == 2


def test_a_lora_checkpoint_is_merged_as_peft_computes_it(judges):
    reward = VideoReward(str(judges.lora), dimension="TA", **TINY)
    scores = reward.score(clips(), PROMPTS)
    assert torch.isfinite(scores).all()
    from safetensors.torch import load_file
    from transformers import Qwen2VLForConditionalGeneration

    adapter = load_file(judges.lora / "checkpoint-7" / "adapter_model.safetensors")
    stem = "base_model.model.model.layers.0.self_attn.q_proj"
    base = Qwen2VLForConditionalGeneration.from_pretrained(judges.base).model.language_model.layers[0].self_attn
    want = base.q_proj.weight + 8 / 4 * adapter[f"{stem}.lora_B.weight"] @ adapter[f"{stem}.lora_A.weight"]  # alpha/r
    got = reward.model["net"].model.language_model.layers[0].self_attn.q_proj.weight
    torch.testing.assert_close(got, want)


def test_a_bad_videoreward_folder_or_option_is_refused_before_loading(judges, tmp_path):
    with pytest.raises(ValueError, match="has no model_config.json: pass the folder of a VideoAlign checkpoint"):
        VideoReward(str(tmp_path), dimension="VQ")
    (tmp_path / "model_config.json").write_text('{"data_config": {"fps": 2.0}, "model_config": {}}')
    with pytest.raises(ValueError, match=r"lacks data_config.max_frame_pixels, prompt_template_type.*lacks "
                                         r"model_config.model_name_or_path.*no checkpoint-<step> folder"):
        VideoReward(str(tmp_path))
    assert VideoReward.config_problems({"model": str(tmp_path)})  # the CLI reports it with the config's problems
    with pytest.raises(ValueError, match="dimension='motion'; choose one of"):
        VideoReward(str(judges.videoalign), dimension="motion")
    with pytest.raises(ValueError, match="set one of them"):
        VideoReward(str(judges.videoalign), fps=2.0, num_frames=8)
    with pytest.raises(FileNotFoundError, match="has no checkpoint-3; it has steps"):
        VideoReward(str(judges.videoalign), checkpoint_step=3, name="step3", **TINY).load()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VideoScore2("./no/such/videoscore2")


def test_videoscore2_generates_from_a_tiny_clip_and_reads_scores_as_the_authors(judges, monkeypatch):
    reward = VideoScore2(str(judges.videoscore2), dimension="VQ", max_pixels=MAX_PIXELS, max_new_tokens=4, **TINY)
    out, start = reward.generate(clips(), PROMPTS)
    assert out.sequences.shape[1] <= start + 4 and len(out.scores) == out.sequences.shape[1] - start
    # a random judge writes no score: NaN (the sample is invalid), not 0
    assert torch.isnan(reward.score(clips(), PROMPTS)).all()
    # a judge that writes the format: hard scores read by the authors' pattern, expected scores from the digit
    # probabilities at each score token
    judge = reward.model
    tokenizer, digits = judge["tokenizer"], judge["digit_ids"]
    reply = tokenizer.encode("visual quality: 4;\ntext-to-video alignment: 2,\nphysical/common-sense consistency: 5",
                             add_special_tokens=False)
    positions = videoscore2.score_positions(reply, tokenizer)
    assert [reply[positions[d]] for d in ("VQ", "TA", "PC")] == [digits[3], digits[1], digits[4]]
    digit_logits = {"VQ": [0.0, 0.0, 0.0, 3.0, 3.0], "TA": [0.0, 2.0, 0.0, 0.0, 0.0], "PC": [0.0] * 5}
    logits = torch.zeros(len(reply), len(tokenizer))
    logits[:, digits] = -5.0  # digits elsewhere do not count
    for d, values in digit_logits.items():
        logits[positions[d], digits] = torch.tensor(values)
    fake = SimpleNamespace(sequences=torch.tensor([[0] * start + reply] * 2),
                           scores=tuple(logits[None].expand(2, -1, -1).unbind(1)))
    monkeypatch.setattr(reward, "generate", lambda c, p: (fake, start))
    # sum_d d * e^l_d / sum_d e^l_d: VQ (6 + 9 e^3) / (3 + 2 e^3) = 4.3375, TA (1 + 3 + 4 + 5 + 2 e^2) / (4 + e^2),
    # PC uniform: 3
    e2, e3 = torch.tensor(2.0).exp().item(), torch.tensor(3.0).exp().item()
    want = {"VQ": (6 + 9 * e3) / (3 + 2 * e3), "TA": (13 + 2 * e2) / (4 + e2), "PC": 3.0}
    scored = reward._judge(clips(), PROMPTS)
    for d, value in want.items():
        torch.testing.assert_close(scored[d].float(), torch.full((2,), value))
    torch.testing.assert_close(scored["mean"].float(), torch.full((2,), sum(want.values()) / 3))
    reward.score_kind = "hard"
    assert reward._judge(clips(), PROMPTS)["PC"].tolist() == [5.0, 5.0]


def test_both_judges_are_served_whole_clips_by_the_reward_server(judges, monkeypatch):
    """The reward server's API in process (as ``test_reward_api.py``): a request of clips (8-bit PNGs, frame by
    frame) is scored by each judge as the same clips are here, and ``RemoteReward(clips=True)`` sends them whole."""
    pytest.importorskip("litserve", reason="the reward server needs the `serve` extra")
    from flowrl.rewards import RemoteReward
    from flowrl.rewards.protocol import decode_scores, encode_images
    from flowrl.rewards.serve import RewardAPI

    served = [VideoReward(str(judges.videoalign), dimension="MQ", **TINY),
              VideoScore2(str(judges.videoscore2), dimension="PC", max_pixels=MAX_PIXELS, max_new_tokens=2, **TINY)]
    api = RewardAPI(served)
    api.setup("cpu")
    video = (clips() * 255).round() / 255  # what 8-bit PNGs carry
    answer = api.encode_response(api.predict(api.decode_request({"images": encode_images(video), "prompts": PROMPTS})))
    scores = decode_scores(answer["scores"])
    torch.testing.assert_close(scores["videoreward_mq"], served[0].score(video, PROMPTS))
    assert torch.isnan(scores["videoscore2_pc"]).all()  # the random judge writes no score, here as there
    remote = RemoteReward("http://127.0.0.1:1", reward="videoreward_mq", clips=True, encoding="array")
    sent = []
    monkeypatch.setattr(remote, "_request", lambda method, path, body: sent.append(body) or api.predict(
        api.decode_request(body)))
    torch.testing.assert_close(remote.score(video, PROMPTS), scores["videoreward_mq"])
    assert sent[0]["images"]["shape"] == [2, 9, 3, 28, 56]


@pytest.mark.slow  # ~15 s of fit on an idle core; its parts are default tests: the judge scoring a clip through its
# loading path (above), the config built by tests/cli/test_every_config_builds.py, and the same Flow-GRPO video
# settings fitted by tests/policies/test_wan_fit.py[wan21_flow_grpo]
def test_the_videoreward_config_fits_two_steps_with_a_tiny_judge(judges, tmp_path):
    """``configs/wan21_videoreward_flow_grpo.yaml`` as shipped, on a tiny Wan 2.1 (32 px, 9 frames) and the tiny
    VideoReward in place of the published one: each dimension is scored on every rollout and logged, the update
    recomputes the sampled log-probs (ratio 1) and the LoRA moves."""
    import yaml
    from diffusers import WanPipeline

    from flowrl.cli import main
    from tests.policies.test_wan_fit import ROOT, logged, tiny_overlay
    from tests.policies.tiny_wan import save, wan21

    config = "wan21_videoreward_flow_grpo"
    shipped = yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())["trainer"]["callbacks"]
    judged = [c for c in shipped if c["class_path"] == "flowrl.rewards.VideoReward"]
    assert [c["init_args"]["dimension"] for c in judged] == ["VQ", "MQ", "TA"]
    overlay = tiny_overlay(tmp_path, str(save(WanPipeline, wan21, tmp_path / "wan21")), config)
    layer = yaml.safe_load(overlay.read_text())
    layer["trainer"]["callbacks"] = [
        {"class_path": c["class_path"], "init_args": {**c["init_args"], "model": str(judges.videoalign), **TINY}}
        for c in judged] + [{"class_path": "tests.cli.dump_outputs.DumpOutputs", "init_args": {"out": str(tmp_path)}}]
    overlay.write_text(yaml.safe_dump(layer))
    main(["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--config", str(overlay)])
    metrics = logged(tmp_path)
    assert metrics["train/check_ratio_max_dev"] < 1e-5
    for dimension in ("vq", "mq", "ta"):
        assert torch.isfinite(torch.tensor(metrics[f"train/reward/videoreward_{dimension}"]))
    assert any(v.any() for k, v in torch.load(tmp_path / "weights.pt").items() if "lora_B" in k)
