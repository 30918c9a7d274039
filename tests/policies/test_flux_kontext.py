"""The FLUX.1 Kontext adapter on a tiny random-weight FluxKontextPipeline loaded through from_pretrained: the prompt
encodings equal the pipeline's, the source latents are encoded once per image, the sigma grid and ODE samples equal
the plain pipeline's, and the VAE decodes in chunks."""

import pytest
import torch
from diffusers import FluxKontextPipeline

from flowrl.policies import FluxKontextPolicy, LoraOptions
from flowrl.policies.flux_kontext import FLUX_KONTEXT_LORA_TARGETS
from flowrl.policies.source_latents import SOURCE, SOURCE_GRID
from flowrl.rewards.pil_images import to_pil
from flowrl.sampling.sampler import sample
from tests.policies.chunked_decode import assert_decodes_in_chunks
from tests.policies.pipeline_oracle import pipeline_run, start_noise
from tests.policies.tiny_editing import source_images

EDITS = ["a red cat", "a photo of a blue dog on the grass"]
AREA = 32 * 48  # a 32 x 48 source keeps its size, and so does a 24 x 64 one (the pipeline keeps both as given)


def kontext(path, **kw):
    return FluxKontextPolicy(path, **{"lora": LoraOptions(rank=4, alpha=8), "resolution": 32, "source_area": AREA,
                                      "max_sequence_length": 16, **kw}).load()


def records():
    return [source_images(1, size=(3, 32, 48))[0], source_images(1, size=(3, 24, 64), seed=1)[0]]


def test_prompt_encodings_are_the_pipelines(flux_kontext_dir):
    policy, pipe = kontext(flux_kontext_dir), FluxKontextPipeline.from_pretrained(flux_kontext_dir)
    images = records()
    cond = policy.encode([EDITS[0], EDITS[1], EDITS[0]], images=[[images[0]], [images[1]], [images[0]]])
    embeds, pooled, _ = pipe.encode_prompt(prompt=EDITS, prompt_2=None, max_sequence_length=16)
    assert cond.embeds.shape == (3, 16, embeds.shape[-1]) and cond.null_embeds is None  # T5 padded to 16, no CFG
    torch.testing.assert_close(cond.embeds, embeds[[0, 1, 0]])
    torch.testing.assert_close(cond.pooled, pooled[[0, 1, 0]])
    assert (cond.embeds[0] - cond.embeds[1]).abs().max() > 1e-4  # the prompts differ, so do their encodings
    for prompt, image in zip(EDITS, images):  # and they are what the pipeline's own call conditions on
        seen = {}
        pipe.set_progress_bar_config(disable=True)
        pipe(image=to_pil(image[None])[0], prompt=prompt, num_inference_steps=1, height=32, width=32,
             max_area=32 * 32, _auto_resize=False, max_sequence_length=16, output_type="latent",
             callback_on_step_end=lambda p, i, t, tensors: seen.update(tensors) or {},
             callback_on_step_end_tensor_inputs=["prompt_embeds"])
        torch.testing.assert_close(cond.embeds[EDITS.index(prompt)], seen["prompt_embeds"][0])


def test_sources_are_encoded_once_per_image_into_shared(flux_kontext_dir, monkeypatch):
    policy = kontext(flux_kontext_dir)
    a, b = records()
    calls = []
    encode = policy._encode_source
    monkeypatch.setattr(policy, "_encode_source", lambda row: calls.append(1) or encode(row))
    cond = policy.encode([EDITS[0], EDITS[1], EDITS[0]], images=[[a], [b], [a]])
    assert len(calls) == 2 and not cond.guided  # guidance-distilled: no unconditional side
    # VAE factor 2, 2x2 packing: 32 x 48 px -> an 8 x 12 token grid; 24 x 64 px -> 6 x 16 (sides are multiples of
    # 4 = VAE factor x packing here, 16 on the published model)
    assert cond.shared[SOURCE_GRID].tolist() == [[[8, 12]], [[6, 16]], [[8, 12]]]
    assert cond.shared[SOURCE].shape == (3, 96, 16)
    policy.encode(EDITS, images=[[b], [a]])
    assert len(calls) == 2  # cached
    assert policy.default_lora_targets == FLUX_KONTEXT_LORA_TARGETS and "proj_mlp" in FLUX_KONTEXT_LORA_TARGETS


def test_sigmas_are_the_pipelines_grid(flux_kontext_dir):
    policy, pipe = kontext(flux_kontext_dir), FluxKontextPipeline.from_pretrained(flux_kontext_dir)
    pipeline_run(pipe, image=to_pil(records()[0][None])[0], prompt=EDITS[0], num_inference_steps=4, height=32,
                 width=32, max_area=32 * 32, _auto_resize=False, max_sequence_length=16)
    torch.testing.assert_close(policy.sigmas(4), pipe.scheduler.sigmas, rtol=0, atol=0)  # the output's tokens only


def test_ode_samples_equal_the_pipelines_for_the_same_noise_and_source(flux_kontext_dir):
    policy, pipe = kontext(flux_kontext_dir), FluxKontextPipeline.from_pretrained(flux_kontext_dir)
    images = records()
    cond = policy.encode(EDITS, images=[[i] for i in images])
    seeds = torch.tensor([7, 8])
    with torch.no_grad():
        latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond.select(rows), 2.5), seeds,
                            policy.sigmas(3), policy.latent_shape(), "ode")
    noise, (c, h, w) = start_noise(policy, seeds), policy.latent_shape()
    for row, image in enumerate(images):  # two source layouts: two transformer batches, each row its own call here
        theirs, decoded = pipeline_run(pipe, image=to_pil(image[None])[0], prompt=[EDITS[row]], guidance_scale=2.5,
                                       num_inference_steps=3, height=32, width=32, max_area=32 * 32,
                                       _auto_resize=False, max_sequence_length=16,
                                       latents=FluxKontextPipeline._pack_latents(noise[row:row + 1], 1, c, h, w))
        ours = latents[row:row + 1, -1]
        torch.testing.assert_close(FluxKontextPipeline._pack_latents(ours, 1, c, h, w), theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(policy.decode(ours), decoded, atol=1e-5, rtol=1e-5)
    other = policy.encode(EDITS, images=[[source_images(1, size=(3, 32, 48), seed=5)[0]]] * 2)
    with torch.no_grad():  # the source conditions the velocity
        z, sigma = noise, policy.sigmas(3)[:2]
        assert (policy.velocity(z, sigma, cond, 2.5) - policy.velocity(z, sigma, other, 2.5)).abs().max() > 1e-4


def test_one_source_image_per_prompt(flux_kontext_dir):
    policy = kontext(flux_kontext_dir)
    a, b = records()
    with pytest.raises(ValueError, match="conditions on source images"):
        policy.encode(EDITS)
    with pytest.raises(ValueError, match=r"exactly 1 source image per prompt; got \[1, 2\]"):
        policy.encode(EDITS, images=[[a], [a, b]])


def test_decode_in_chunks_equals_whole(flux_kontext_dir, monkeypatch):
    assert_decodes_in_chunks(lambda **kw: kontext(flux_kontext_dir, **kw), monkeypatch)


def test_bad_options_fail_before_any_weight_loads(flux_kontext_dir, refuse_weights):
    with pytest.raises(ValueError, match=r"source_area=100 must be >= 256(.|\n)*image_cache_size=-2"):
        kontext(flux_kontext_dir, source_area=100, image_cache_size=-2)


class _Resized(Exception):
    """Raised by the spy on ``image_processor.resize``: the size is chosen, nothing after it needs to run."""


def _chosen_size(monkeypatch, run) -> tuple[int, int]:
    from diffusers.image_processor import VaeImageProcessor

    def spy(self, image, height=None, width=None, **kw):
        raise _Resized(height, width)

    monkeypatch.setattr(VaeImageProcessor, "resize", spy)
    with pytest.raises(_Resized) as caught:
        run()
    monkeypatch.undo()
    return caught.value.args


def test_automatic_source_size_is_the_pipelines_for_sizes_off_the_multiple(flux_kontext_dir, monkeypatch):
    """``source_area: null``: the preferred resolution the pipeline picks, for sources whose sides are not multiples
    of the image processor's multiple (4 on the tiny model, 16 on the published one)."""
    from flowrl.policies.flux_kontext import source_size
    policy, pipe = kontext(flux_kontext_dir, source_area=None), FluxKontextPipeline.from_pretrained(flux_kontext_dir)
    multiple = pipe.vae_scale_factor * 2
    sizes = [(h, w) for h in (17, 30, 45, 63) for w in (21, 26, 51, 66, 90)]
    from_raw_ratio = 0
    for height, width in sizes:
        image = source_images(1, size=(3, height, width))[0]
        ours = _chosen_size(monkeypatch, lambda: policy._encode_source([image]))
        theirs = _chosen_size(monkeypatch, lambda: pipe(image=to_pil(image[None])[0], prompt="x", height=32,
                                                          width=32, num_inference_steps=1, output_type="latent"))
        assert ours == theirs, (height, width)
        from_raw_ratio += source_size(height, width, None, multiple) != ours
    assert from_raw_ratio > 0  # the ratio of the raw size picks another resolution for some of these sizes
