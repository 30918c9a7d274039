"""The Qwen-Image-Edit adapter on tiny random-weight QwenImageEditPlusPipeline / QwenImageEditPipeline folders loaded
through from_pretrained: prompt+image encodings (of both models), the sigma grid and ODE samples equal the plain
pipelines'; the VAE decodes in chunks."""

import pytest
import torch
from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit, pipeline_qwenimage_edit_plus

from flowrl.policies import LoraOptions, QwenImageEditPolicy
from flowrl.policies.source_latents import SOURCE, SOURCE_GRID
from flowrl.rewards.pil_images import to_pil
from flowrl.sampling.sampler import sample
from tests.policies.chunked_decode import assert_decodes_in_chunks
from tests.policies.pipeline_oracle import pipeline_run, start_noise
from tests.policies.tiny_editing import CONDITION_AREA, SOURCE_AREA, source_images

PIPELINES = {"plus": QwenImageEditPlusPipeline, "edit": QwenImageEditPipeline}
EDITS = ["make the cat blue", "remove the tree"]


def edit(path, **kw):
    return QwenImageEditPolicy(path, **{"lora": LoraOptions(rank=4, alpha=8), "resolution": 32,
                                        "source_area": SOURCE_AREA, "condition_area": CONDITION_AREA, **kw}).load()


@pytest.fixture
def tiny_sizes(monkeypatch):
    """The pipelines' source sizes (1024 x 1024 for the VAE, 384 x 384 for Edit-Plus's vision tower) scaled to the
    tiny models, where each pipeline reads them."""
    monkeypatch.setattr(pipeline_qwenimage_edit_plus, "VAE_IMAGE_SIZE", SOURCE_AREA)
    monkeypatch.setattr(pipeline_qwenimage_edit_plus, "CONDITION_IMAGE_SIZE", CONDITION_AREA)
    sized = pipeline_qwenimage_edit.calculate_dimensions  # Edit computes 1024 * 1024 inline
    monkeypatch.setattr(pipeline_qwenimage_edit, "calculate_dimensions", lambda area, ratio: sized(SOURCE_AREA, ratio))


@pytest.fixture
def folders(qwen_edit_plus_dir, qwen_edit_dir):
    return {"plus": qwen_edit_plus_dir, "edit": qwen_edit_dir}


def pipeline_embeds(pipe, image, prompt, **call):
    """The prompt embeddings the pipeline's own call computes for ``prompt`` with ``image`` (read at its first
    step)."""
    seen = {}

    def keep(pipe, step, timestep, tensors):
        seen["embeds"] = tensors["prompt_embeds"]
        return {}

    pipe.set_progress_bar_config(disable=True)
    pipe(image=image, prompt=prompt, num_inference_steps=2, height=32, width=32, callback_on_step_end=keep,
         callback_on_step_end_tensor_inputs=["prompt_embeds"], output_type="latent", **call)
    return seen["embeds"][0]


def test_encodings_are_the_pipelines_per_record_and_each_record_is_encoded_once(qwen_edit_plus_dir, tiny_sizes,
                                                                               monkeypatch):
    policy, pipe = edit(qwen_edit_plus_dir), QwenImageEditPlusPipeline.from_pretrained(qwen_edit_plus_dir)
    a, b = source_images(2)
    calls = []
    encode_prompt = QwenImageEditPlusPipeline.encode_prompt
    monkeypatch.setattr(QwenImageEditPlusPipeline, "encode_prompt",
                        lambda self, **kw: calls.append(kw["prompt"]) or encode_prompt(self, **kw))
    cond = policy.encode([EDITS[0], EDITS[1], EDITS[0]], images=[[a, b], [b], [a, b]])
    assert len(calls) == 4  # two records, each with its prompt and with the negative prompt
    policy.encode([EDITS[1], EDITS[0]], images=[[b], [a, b]])
    assert len(calls) == 4  # cached
    for row, (images, prompt) in enumerate([([a, b], EDITS[0]), ([b], EDITS[1])]):
        want = pipeline_embeds(pipe, [to_pil(i[None])[0] for i in images], prompt)
        length = int(cond.extra["mask"][row].sum())
        assert length == len(want)  # the template's tokens after the 64 dropped, with each source's image tokens
        torch.testing.assert_close(cond.embeds[row, :length], want)
    assert cond.embeds.shape[1] > int(cond.extra["mask"][1].sum())  # two sources' tokens vs one: padded and masked
    torch.testing.assert_close(cond.embeds[2], cond.embeds[0])
    # sources at 32 x 32 px (a 40 x 48 image at 1024 px, multiples of 32): 8 x 8 latents, a 4 x 4 token grid each
    assert cond.shared[SOURCE_GRID].tolist() == [[[4, 4], [4, 4]], [[4, 4], [0, 0]], [[4, 4], [4, 4]]]
    assert cond.shared[SOURCE].shape == (3, 32, 16) and cond.shared[SOURCE][1, 16:].abs().max() == 0


def test_the_single_source_models_encodings_are_the_pipelines(qwen_edit_dir, tiny_sizes):
    """Qwen-Image-Edit (the first release): its template, with the source read by the vision tower at the VAE size."""
    policy, pipe = edit(qwen_edit_dir), QwenImageEditPipeline.from_pretrained(qwen_edit_dir)
    wide = source_images(1, size=(3, 30, 90), seed=3)[0]  # another aspect ratio: another count of image tokens
    a, = source_images(1)
    cond = policy.encode([EDITS[0], EDITS[1], EDITS[0]], images=[[a], [wide], [a]])
    lengths = cond.extra["mask"].sum(1).tolist()
    assert lengths[0] != lengths[1] and lengths[0] == lengths[2]  # padded to one length and masked
    for row, (image, prompt) in enumerate([(a, EDITS[0]), (wide, EDITS[1])]):
        want = pipeline_embeds(pipe, to_pil(image[None])[0], prompt)
        assert lengths[row] == len(want)  # the edit template's tokens after the 64 dropped, the source's included
        torch.testing.assert_close(cond.embeds[row, :lengths[row]], want)
        negative = pipeline_embeds(pipe, to_pil(image[None])[0], " ", true_cfg_scale=1.0)  # " ": the policy's default
        torch.testing.assert_close(cond.null_embeds[row, :int(cond.null_extra["mask"][row].sum())], negative)
    torch.testing.assert_close(cond.embeds[2], cond.embeds[0])


def test_sigmas_are_the_pipelines_grid(qwen_edit_plus_dir, tiny_sizes):
    policy, pipe = edit(qwen_edit_plus_dir), QwenImageEditPlusPipeline.from_pretrained(qwen_edit_plus_dir)
    pipeline_run(pipe, image=[to_pil(source_images(1)[0][None])[0]], prompt=EDITS[0], num_inference_steps=4,
                 height=32, width=32)
    # the shift reads the output's 16 tokens, not the sources': the grid equals text-to-image Qwen-Image's
    torch.testing.assert_close(policy.sigmas(4), pipe.scheduler.sigmas, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["plus", "edit"])
def test_ode_samples_equal_the_pipelines_for_the_same_noise_and_sources(kind, folders, tiny_sizes):
    policy, pipe = edit(folders[kind]), PIPELINES[kind].from_pretrained(folders[kind])
    wide = source_images(1, size=(3, 30, 90), seed=3)[0]  # 3:1, 64 x 32 px at 1024 px: another token layout
    records = ([source_images(2), [wide]] if kind == "plus" else [source_images(1), [wide]])
    cond = policy.encode(EDITS, images=records)
    assert cond.shared[SOURCE_GRID][0].tolist() != cond.shared[SOURCE_GRID][1].tolist()  # two transformer batches
    seeds = torch.tensor([5, 6])
    with torch.no_grad():
        latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond.select(rows), 3.0), seeds,
                            policy.sigmas(3), policy.latent_shape(), "ode")
    noise, (c, h, w) = start_noise(policy, seeds), policy.latent_shape()
    for row, images in enumerate(records):
        pils = [to_pil(i[None])[0] for i in images]
        theirs, image = pipeline_run(pipe, image=pils if kind == "plus" else pils[0], prompt=[EDITS[row]],
                                     negative_prompt=[" "], true_cfg_scale=3.0, num_inference_steps=3, height=32,
                                     width=32, latents=PIPELINES[kind]._pack_latents(noise[row:row + 1], 1, c, h, w))
        ours = latents[row:row + 1, -1]
        torch.testing.assert_close(PIPELINES[kind]._pack_latents(ours, 1, c, h, w), theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(policy.decode(ours), image, atol=1e-5, rtol=1e-5)
    other = policy.encode(EDITS, images=[[source_images(1, seed=9)[0]]] * 2)
    with torch.no_grad():  # the sources condition the velocity
        z, sigma = noise, policy.sigmas(3)[:2]
        assert (policy.velocity(z, sigma, cond, 3.0) - policy.velocity(z, sigma, other, 3.0)).abs().max() > 1e-4


def test_image_counts_are_checked_per_model(folders):
    plus, single = edit(folders["plus"]), edit(folders["edit"])
    assert QwenImageEditPolicy.conditioning_images == -1 and single.conditioning_images == 1
    a, b = source_images(2)
    with pytest.raises(ValueError, match="conditions on source images"):
        plus.encode(EDITS)
    with pytest.raises(ValueError, match=r"exactly 1 source image per prompt; got \[1, 2\]"):
        single.encode(EDITS, images=[[a], [a, b]])
    with pytest.raises(ValueError, match=r"at least 1 source image per prompt; got \[0, 1\]"):
        plus.encode(EDITS, images=[[], [a]])


@pytest.mark.parametrize("kind", ["plus", "edit"])
def test_decode_in_chunks_equals_whole(kind, folders, monkeypatch):
    assert_decodes_in_chunks(lambda **kw: edit(folders[kind], **kw), monkeypatch)


def test_bad_options_and_folders_fail_before_any_weight_loads(qwen_edit_plus_dir, qwen_image_dir, refuse_weights):
    with pytest.raises(ValueError, match=r"names QwenImagePipeline, not an edit pipeline(.|\n)*"
                                         r"source_area=100 must be >= 1024"):
        edit(qwen_image_dir, source_area=100)
    with pytest.raises(ValueError, match="image_cache_size=-1"):
        edit(qwen_edit_plus_dir, image_cache_size=-1)


def test_the_published_processor_needs_torchvision_and_says_so(monkeypatch):
    import importlib.util

    from flowrl.policies.qwen_image_edit import qwen_image_edit_problems

    published = {"_class_name": "QwenImageEditPlusPipeline", "processor": ["transformers", "Qwen2VLProcessor"]}
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else find(name, *a))
    problems = qwen_image_edit_problems(published, 1024 * 1024, 384 * 384, 8)
    assert problems == ["policy.model: Qwen-Image-Edit's processor (transformers' Qwen2VLProcessor) needs torchvision; "
                        "pip install 'flowrl[editing]' (or torchvision, the build that matches your torch)"]
    assert qwen_image_edit_problems({**published, "processor": ["mypkg", "Processor"]}, 1024, 784, 0) == []

