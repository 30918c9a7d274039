"""The cases of :mod:`tests.policies.fidelity`, one per family: how its policy is built on the tiny folder, how its
pipeline is called for the same prompts, guidance and negative prompt, and which of the pipeline's encodings each
of the policy's ``Conditioning`` fields equals."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import diffusers
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit, pipeline_qwenimage_edit_plus

from flowrl import policies
from flowrl.policies import LoraOptions
from flowrl.policies.sd15 import noise_to_signal
from flowrl.rewards.pil_images import to_pil
from tests.policies.fidelity import NEGATIVE, PROMPTS, Case, packed
from tests.policies.tiny_editing import CONDITION_AREA, SOURCE_AREA, source_images
from tests.policies.tiny_hunyuan15 import SHORT_TEXT, short_text

LORA = LoraOptions(rank=4, alpha=8)
WAN_SIZE = dict(height=32, width=48, num_frames=9)  # non-square: 4 x 6 latents


def square(pipe_kw: dict) -> dict:
    """A 32 px pipeline call for the prompts (the image families' policies make square images)."""
    return {"prompt": list(PROMPTS), "height": 32, "width": 32, **pipe_kw}


def sd15_sigmas(pipe):
    """flowrl's SD1.5 grid: the noise-to-signal ratios of the DDIM timesteps, then of the final alpha."""
    import torch

    acp = pipe.scheduler.alphas_cumprod
    final = torch.as_tensor(pipe.scheduler.final_alpha_cumprod).reshape(1)
    return torch.cat([noise_to_signal(acp[pipe.scheduler.timesteps.long()]), noise_to_signal(final)])


def wan_embeds(pipe, max_sequence_length=16):
    """WanPipeline's encodings of the prompts and of the negative prompt (the image-to-video pipeline encodes text
    the same way but cleans it with ftfy unconditionally, which the test environment lacks)."""
    text = diffusers.WanPipeline(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
                                 transformer=pipe.transformer, scheduler=pipe.scheduler)
    return text.encode_prompt(list(PROMPTS), NEGATIVE, True, max_sequence_length=max_sequence_length)


def wan_text(pipe, cond, max_sequence_length=16):
    embeds, null = wan_embeds(pipe, max_sequence_length)
    return [(cond.embeds, embeds), (cond.null_embeds, null)]


def first_frame():
    return source_images(1, size=(3, 40, 56), seed=1)[0]  # another size and aspect than the video's


def wan_i2v_call(policy, pipe, guidance, **kw):
    """The image-to-video pipeline given the prompts' embeddings (see :func:`wan_text`)."""
    embeds, null = wan_embeds(pipe, policy.max_sequence_length)
    return dict(image=to_pil(first_frame()[None])[0], prompt_embeds=embeds, negative_prompt_embeds=null,
                guidance_scale=guidance, **WAN_SIZE, **kw)


@contextmanager
def qwen_edit_sizes():
    """The Edit pipelines' source sizes (1024 x 1024 for the VAE, and the vision tower's: Edit-Plus's 384 x 384,
    Edit's the VAE's) scaled to the tiny models, as the policies are built with them."""
    sized = pipeline_qwenimage_edit.calculate_dimensions  # Edit computes 1024 * 1024 inline
    with mock.patch.object(pipeline_qwenimage_edit_plus, "VAE_IMAGE_SIZE", SOURCE_AREA), \
            mock.patch.object(pipeline_qwenimage_edit_plus, "CONDITION_IMAGE_SIZE", CONDITION_AREA), \
            mock.patch.object(pipeline_qwenimage_edit, "calculate_dimensions",
                              lambda area, ratio: sized(SOURCE_AREA, ratio)):
        yield


def edit_source():
    return source_images(1, size=(3, 24, 40), seed=3)[0]  # 5:3, not a multiple of 16


def qwen_edit_embeds(pipe, cond):
    """The prompt and negative embeddings the Edit pipelines compute with the source (their prompts read the image
    through the vision tower: Edit-Plus at its condition size, a list; Edit at the VAE size)."""
    image = to_pil(edit_source()[None])[0]
    if isinstance(pipe, diffusers.QwenImageEditPlusPipeline):
        width, height = pipeline_qwenimage_edit_plus.calculate_dimensions(CONDITION_AREA, image.width / image.height)
        seen = [pipe.image_processor.resize(image, height, width)]
    else:
        width, height, _ = pipeline_qwenimage_edit.calculate_dimensions(SOURCE_AREA, image.width / image.height)
        seen = pipe.image_processor.resize(image, height, width)
    embeds, _ = pipe.encode_prompt(list(PROMPTS[:1]), seen)
    null, _ = pipe.encode_prompt([NEGATIVE], seen)
    return [(cond.embeds, embeds), (cond.null_embeds, null)]


def qwen_edit(folder: str, pipeline: str) -> Case:
    """A Qwen-Image-Edit case: one prompt (the pipelines read a list of images as one prompt's sources)."""
    source = lambda: to_pil(edit_source()[None])[0]  # noqa: E731
    return Case(folder, lambda p: policies.QwenImageEditPolicy(
        p, lora=LORA, resolution=32, source_area=SOURCE_AREA, condition_area=CONDITION_AREA,
        negative_prompt=NEGATIVE).load(), pipeline, lambda policy, pipe, g: square(dict(
            prompt=list(PROMPTS[:1]), image=[source()] if "Plus" in pipeline else source(),
            negative_prompt=[NEGATIVE], true_cfg_scale=g)),
        qwen_edit_embeds, packed(pipeline), images=lambda: [[edit_source()]], sizes=qwen_edit_sizes, rows=1)


HY15_SIZE = dict(height=12, width=16, num_frames=5)  # a size bucket of the tiny transformer: 3 x 3 x 4 latents


def hunyuan15_guided(pipe, guidance: float) -> None:
    """The pipeline's guidance is its guider's scale (no call argument): set it to the case's."""
    pipe.guider = pipe.guider.new(guidance_scale=guidance)


def hunyuan15_text(pipe, cond, rows: int = 2):
    """The pipeline's four encodings (Qwen embeddings and mask, ByT5 glyph embeddings and mask) of the prompts and of
    the negative prompt, beside the policy's ``embeds`` and ``extra`` (a quoted glyph text: test_hunyuan_video15.py)."""
    ours = [cond.embeds, *cond.extra.values(), cond.null_embeds, *cond.null_extra.values()]
    short_text(pipe)
    theirs = [*pipe.encode_prompt(list(PROMPTS[:rows]), "cpu", batch_size=rows),
              *pipe.encode_prompt([NEGATIVE] * rows, "cpu", batch_size=rows)]
    return list(zip(ours, theirs))


def hunyuan15_call(policy, pipe, guidance, rows: int = 2, **kw):
    hunyuan15_guided(pipe, guidance)
    short_text(pipe)
    return dict(prompt=list(PROMPTS[:rows]), negative_prompt=[NEGATIVE] * rows, num_frames=5, **kw)


CASES = {
    "SD3": Case("sd3_dir", lambda p: policies.SD3Policy(p, lora=LORA, resolution=32, max_sequence_length=8).load(),
                "StableDiffusion3Pipeline", lambda policy, pipe, g: square(dict(guidance_scale=g,
                                                                                max_sequence_length=8)),
                lambda pipe, cond: list(zip([cond.embeds, cond.null_embeds, cond.pooled, cond.null_pooled], [
                    pipe.encode_prompt(list(PROMPTS), None, None, max_sequence_length=8)[i] for i in (0, 1, 2, 3)]))),
    "FLUX.1": Case("flux_dir", lambda p: policies.FluxPolicy(p, lora=LORA, resolution=32, max_sequence_length=8).load(),
                   "FluxPipeline", lambda policy, pipe, g: square(dict(guidance_scale=g, max_sequence_length=8)),
                   lambda pipe, cond: list(zip([cond.embeds, cond.pooled], pipe.encode_prompt(
                       list(PROMPTS), None, max_sequence_length=8)[:2])), packed("FluxPipeline")),
    "FLUX.1 Kontext": Case(
        "flux_kontext_dir", lambda p: policies.FluxKontextPolicy(p, lora=LORA, resolution=32, source_area=24 * 40,
                                                             max_sequence_length=16).load(),
        "FluxKontextPipeline", lambda policy, pipe, g: square(dict(
            image=to_pil(edit_source()[None])[0], guidance_scale=g, max_area=32 * 32, _auto_resize=False,
            max_sequence_length=16)),
        lambda pipe, cond: list(zip([cond.embeds, cond.pooled], pipe.encode_prompt(
            list(PROMPTS), None, max_sequence_length=16)[:2])), packed("FluxKontextPipeline"),
        images=lambda: [[edit_source()], [edit_source()]]),
    "FLUX.2 [klein]": Case(
        "flux2_dir", lambda p: policies.Flux2Policy(p, lora=LORA, resolution=32, max_sequence_length=16).load(),
        "Flux2KleinPipeline", lambda policy, pipe, g: square(dict(guidance_scale=g, max_sequence_length=16)),
        lambda pipe, cond: [(cond.embeds, pipe.encode_prompt(list(PROMPTS), max_sequence_length=16)[0]),
                            (cond.null_embeds, pipe.encode_prompt([""], max_sequence_length=16)[0])],
        lambda policy, z: diffusers.Flux2KleinPipeline._pack_latents(z), start=lambda policy, z: z),
    "SD1.5": Case("sd15_dir", lambda p: policies.SD15Policy(p, lora=LORA, resolution=32).load(),
                  "StableDiffusionPipeline", lambda policy, pipe, g: square(dict(guidance_scale=g, eta=0.0)),
                  lambda pipe, cond: list(zip([cond.embeds, cond.null_embeds], pipe.encode_prompt(
                      list(PROMPTS), "cpu", 1, True))), sigmas=sd15_sigmas, solver="DDIMScheduler"),
    "Qwen-Image": Case(
        "qwen_image_dir", lambda p: policies.QwenImagePolicy(p, lora=LORA, resolution=32, max_sequence_length=16,
                                                         negative_prompt=NEGATIVE).load(),
        "QwenImagePipeline", lambda policy, pipe, g: square(dict(
            negative_prompt=[NEGATIVE] * 2, true_cfg_scale=g, max_sequence_length=16)),
        lambda pipe, cond: [(cond.embeds, pipe.encode_prompt(list(PROMPTS), max_sequence_length=16)[0]),
                            (cond.null_embeds, pipe.encode_prompt([NEGATIVE] * 2, max_sequence_length=16)[0])],
        packed("QwenImagePipeline")),
    # one prompt: the pipeline pads a batch's prompts, which moves a shorter prompt's image in RoPE (the policy runs
    # each length unpadded, test_qwen_image21.py); the longer negative prompt runs as its own length group
    "Qwen-Image 2.1": Case(
        "qwen_image21_dir", lambda p: policies.QwenImage21Policy(p, lora=LORA, resolution=64,
                                                             negative_prompt=NEGATIVE).load(),
        "QwenImage21Pipeline", lambda policy, pipe, g: dict(
            prompt=list(PROMPTS[:1]), height=64, width=64, negative_prompt=[NEGATIVE], true_cfg_scale=g),
        lambda pipe, cond: [(cond.embeds, pipe.encode_prompt(list(PROMPTS[:1]))[0]),
                            (cond.null_embeds, pipe.encode_prompt([NEGATIVE])[0])],
        packed("QwenImage21Pipeline"), rows=1),
    "Qwen-Image-Edit": qwen_edit("qwen_edit_dir", "QwenImageEditPipeline"),
    "Qwen-Image-Edit-Plus": qwen_edit("qwen_edit_plus_dir", "QwenImageEditPlusPipeline"),
    "Z-Image": Case(
        "zimage_dir", lambda p: policies.ZImagePolicy(p, lora=LORA, resolution=32, max_sequence_length=32,
                                                  negative_prompt=NEGATIVE).load(),
        # flowrl's scale w is the pipeline's g = w - 1 (its CFG adds g (cond - uncond) to cond)
        "ZImagePipeline", lambda policy, pipe, g: square(dict(
            negative_prompt=[NEGATIVE] * 2, guidance_scale=g - 1, cfg_normalization=False, max_sequence_length=32)),
        lambda pipe, cond: [pair for embeds, null in [pipe.encode_prompt(
            list(PROMPTS), negative_prompt=[NEGATIVE] * 2, max_sequence_length=32)]
            for row in range(2) for pair in [(cond.embeds[row:row + 1], embeds[row][None]),
                                              (cond.null_embeds[row:row + 1], null[row][None])]]),
    "Wan 2.1 T2V": Case(
        "wan21", lambda p: policies.WanPolicy(p, lora=LORA, max_sequence_length=16, negative_prompt=NEGATIVE,
                                              **WAN_SIZE).load(),
        "WanPipeline", lambda policy, pipe, g: dict(prompt=list(PROMPTS), negative_prompt=NEGATIVE, guidance_scale=g,
                                                    max_sequence_length=16, **WAN_SIZE), wan_text),
    "Wan 2.2 T2V": Case(
        "wan22", lambda p: policies.WanPolicy(p, lora=LORA, max_sequence_length=16, negative_prompt=NEGATIVE,
                                              guidance_scale_2=2.0, **WAN_SIZE).load(),
        "WanPipeline", lambda policy, pipe, g: dict(prompt=list(PROMPTS), negative_prompt=NEGATIVE, guidance_scale=g,
                                                    guidance_scale_2=2.0, max_sequence_length=16, **WAN_SIZE),
        wan_text),
    "Wan 2.1 I2V": Case(
        "wan21_i2v", lambda p: policies.WanI2VPolicy(p, lora=LORA, negative_prompt=NEGATIVE, **WAN_SIZE).load(),
        "WanImageToVideoPipeline", wan_i2v_call, lambda pipe, cond: wan_text(pipe, cond, 512),
        images=lambda: [[first_frame()], [first_frame()]]),
    "Wan 2.2 I2V": Case(
        "wan22_i2v", lambda p: policies.WanI2VPolicy(p, lora=LORA, max_sequence_length=16, negative_prompt=NEGATIVE,
                                                     guidance_scale_2=2.0, **WAN_SIZE).load(),
        "WanImageToVideoPipeline", lambda policy, pipe, g: wan_i2v_call(policy, pipe, g, guidance_scale_2=2.0),
        wan_text, images=lambda: [[first_frame()], [first_frame()]]),
    "HunyuanVideo 1.5 T2V": Case(
        "hunyuan15_t2v", lambda p: policies.HunyuanVideo15Policy(p, lora=LORA, negative_prompt=NEGATIVE,
                                                                 **HY15_SIZE, **SHORT_TEXT).load(),
        "HunyuanVideo15Pipeline", lambda policy, pipe, g: hunyuan15_call(policy, pipe, g, height=12, width=16),
        hunyuan15_text),
    # one prompt: the image-to-video pipeline encodes one image for the batch; its 40 x 56 frame's bucket is 12 x 16
    "HunyuanVideo 1.5 I2V": Case(
        "hunyuan15_i2v", lambda p: policies.HunyuanVideo15I2VPolicy(p, lora=LORA, negative_prompt=NEGATIVE,
                                                                    **HY15_SIZE, **SHORT_TEXT).load(),
        "HunyuanVideo15ImageToVideoPipeline", lambda policy, pipe, g: hunyuan15_call(
            policy, pipe, g, rows=1, image=to_pil(first_frame()[None])[0]),
        lambda pipe, cond: hunyuan15_text(pipe, cond, rows=1),
        images=lambda: [[first_frame()]], rows=1),
}
