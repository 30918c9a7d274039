"""The Wan image-to-video adapter on tiny random-weight WanImageToVideoPipelines (Wan 2.1 I2V with its CLIP image
encoder; Wan 2.2 I2V A14B's two experts): the first frame's conditioning is the pipeline's, encoded once per distinct
image, and the ODE sample is the pipeline's for the same noise and image; images of the wrong count are refused."""

import pytest
import torch
from diffusers import WanImageToVideoPipeline

from flowrl.policies import LoraOptions, WanI2VPolicy
from flowrl.rewards.pil_images import to_pil
from flowrl.sampling.sampler import sample, seeded_noise
from tests.policies.tiny_wan import FRAMES, SIZE

PROMPTS, SEEDS = ["a red cat", "a blue dog"], torch.tensor([3, 4])


def i2v(path, **kw):
    return WanI2VPolicy(path, **{"lora": LoraOptions(rank=4, alpha=8), "height": SIZE, "width": SIZE,
                                 "num_frames": FRAMES, **kw}).load()


def first_frames(seed=0, size=(3, 40, 48)):
    """Two 8-bit first frames of another size than the video's (the pipeline resizes them)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, size, generator=gen).float() / 255) for _ in range(2)]


def test_conditioning_is_the_pipelines_and_each_image_is_encoded_once(wan_dirs, monkeypatch):
    policy = i2v(wan_dirs["wan21_i2v"])
    pipe = WanImageToVideoPipeline.from_pretrained(wan_dirs["wan21_i2v"])
    frames = first_frames()
    calls = []
    encode = policy._encode_image
    monkeypatch.setattr(policy, "_encode_image", lambda image: calls.append(1) or encode(image))
    cond = policy.encode(PROMPTS * 2, images=[[frames[0]], [frames[1]], [frames[0]], [frames[1]]])
    assert len(calls) == 2  # a group's rows share one encoding
    assert cond.shared["condition"].shape == (4, 4 + 16, 3, 4, 4)  # mask + image latents per latent frame
    assert cond.shared["image_embeds"].shape == (4, 17, 16)  # CLIP's penultimate states: 16 patches + class
    pixels = pipe.video_processor.preprocess(to_pil(frames[1][None])[0], height=SIZE, width=SIZE)
    _, want = pipe.prepare_latents(pixels, 1, 16, SIZE, SIZE, FRAMES, torch.float32, "cpu", None,
                                   torch.zeros(1, 16, 3, 4, 4))
    torch.testing.assert_close(cond.shared["condition"][1], want[0])
    assert cond.shared["condition"][1, :4, 0].min() == 1 and cond.shared["condition"][1, :4, 1:].max() == 0
    torch.testing.assert_close(cond.shared["image_embeds"][3], pipe.encode_image(to_pil(frames[1][None])[0],
                                                                                  "cpu")[0])
    policy.encode(PROMPTS, images=[[frames[1]], [frames[0]]])
    assert len(calls) == 2  # cached across batches


@pytest.mark.parametrize("name, extra", [("wan21_i2v", {}), ("wan22_i2v", {"guidance_scale_2": 2.0})])
def test_ode_sample_is_the_pipelines_for_the_same_noise_and_first_frame(wan_dirs, name, extra):
    policy = i2v(wan_dirs[name], **extra, **({} if name == "wan21_i2v" else {"max_sequence_length": 16}))
    pipe = WanImageToVideoPipeline.from_pretrained(wan_dirs[name])
    assert (policy.image_encoder is None) == (name == "wan22_i2v")  # Wan 2.2 I2V reads no CLIP image tokens
    frame = first_frames(1)[0]
    cond = policy.encode(PROMPTS, images=[[frame], [frame]])
    velocity = lambda z, sigma, rows: policy.velocity(z, sigma, cond.select(rows), 4.0)  # noqa: E731
    latents, _ = sample(velocity, SEEDS, policy.sigmas(3), policy.latent_shape(), "ode")
    noise = seeded_noise(SEEDS, policy.latent_shape(), 1)[:, 0]
    # the prompts' embeddings as the adapter's (the same as WanPipeline's encode_prompt, test_wan.py): diffusers'
    # WanImageToVideoPipeline cleans prompts with ftfy unconditionally, which the test environment lacks
    want = pipe(image=to_pil(frame[None])[0], prompt_embeds=cond.embeds, negative_prompt_embeds=cond.null_embeds,
                height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=3, guidance_scale=4.0, latents=noise,
                output_type="latent", **extra).frames
    torch.testing.assert_close(latents[:, -1], want, atol=1e-5, rtol=1e-5)
    other = policy.encode(PROMPTS, images=[[first_frames(2)[0]]] * 2)
    with torch.no_grad():  # the first frame conditions the velocity
        z, sigma = noise, policy.sigmas(3)[:2]
        assert (policy.velocity(z, sigma, cond, 4.0) - policy.velocity(z, sigma, other, 4.0)).abs().max() > 1e-4


def test_images_are_required_one_per_prompt(wan_dirs):
    policy = i2v(wan_dirs["wan21_i2v"])
    assert WanI2VPolicy.conditioning_images == 1
    with pytest.raises(ValueError, match="conditions on source images"):
        policy.encode(PROMPTS)
    frames = first_frames()
    with pytest.raises(ValueError, match=r"exactly 1 conditioning image .* got \[1, 2\] per prompt"):
        policy.encode(PROMPTS, images=[[frames[0]], frames])


def test_wan21_i2v_needs_the_512_text_tokens_its_attention_splits_at(wan_dirs):
    with pytest.raises(ValueError, match="policy.max_sequence_length=16: .* set it to 512"):
        i2v(wan_dirs["wan21_i2v"], max_sequence_length=16)


def test_ti2v_5b_image_to_video_is_refused_with_the_reason(wan_dirs):
    with pytest.raises(ValueError, match="TI2V-5B pipeline .* overwrites the first latent frame .* use "
                                         "flowrl.policies.WanPolicy for its text-to-video"):
        i2v(wan_dirs["ti2v"], height=64, width=64)
