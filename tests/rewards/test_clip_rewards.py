"""PickScore, HPSv2, CLIPScore and the LAION aesthetic predictor on a tiny random CLIP loaded from a folder."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flowrl.rewards.aesthetic import Aesthetic, AestheticHead
from flowrl.rewards.clip_score import CLIPScore, FeatureCLIP, TensorProcessor
from flowrl.rewards.hps import HPSv2
from flowrl.rewards.pickscore import PickScore
from tests.rewards.test_clip_preprocess import hps_reference, pil_images
from tests.rewards.tiny_clip import PROJECTION_DIM, save_tiny_clip, set_constant_embeddings

KINDS = ["pickscore", "hpsv2", "clip_score", "aesthetic"]
PROMPTS = ["a red cat", "dog", "red dog", "cat", "a cat and a dog", "red", "", "dog dog dog dog dog dog dog dog"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return str(save_tiny_clip(tmp_path_factory.mktemp("clip")))


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("head") / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save(AestheticHead(PROJECTION_DIM).state_dict(), path)
    return str(path)


def make(kind: str, path: str, head: str = None, **kwargs):
    if kind == "pickscore":
        return PickScore(model=path, processor=path, **kwargs)
    if kind == "hpsv2":
        return HPSv2(model=path, processor=path, **kwargs)
    if kind == "clip_score":
        return CLIPScore(model=path, **kwargs)
    return Aesthetic(model=path, head=head, **kwargs)


def images(b: int = 8, h: int = 40, w: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", KINDS)
def test_shape_batching_invariance_and_determinism(kind, clip_dir, head_file):
    x = images()
    one = make(kind, clip_dir, head_file, batch_size=1).score(x, PROMPTS)
    eight = make(kind, clip_dir, head_file, batch_size=8)
    scores = eight.score(x, PROMPTS)
    assert scores.shape == (8,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    torch.testing.assert_close(one, scores, rtol=1e-5, atol=1e-5)
    assert torch.equal(eight.score(x, PROMPTS), scores)
    torch.testing.assert_close(make(kind, clip_dir, head_file, batch_size=3).score(x[:3], PROMPTS[:3]), scores[:3],
                               rtol=1e-5, atol=1e-5)  # a fresh instance, a ragged last chunk
    if kind != "aesthetic":  # the aesthetic score ignores the prompt; the others must not
        assert not torch.allclose(eight.score(x, PROMPTS[::-1]), scores)


def reference_embeddings(path: str, x: torch.Tensor, prompts: list[str], layout: str = "crop"):
    """Unit-norm embeddings the published way: PIL images through the processor (or HPSv2's pad), plain transformers."""
    from transformers import AutoProcessor, CLIPModel

    processor, model = AutoProcessor.from_pretrained(path), CLIPModel.from_pretrained(path).eval()
    if layout == "crop":
        pixels = processor(images=pil_images(x), return_tensors="pt")["pixel_values"]
    else:
        pixels = torch.tensor(np.stack([hps_reference(im, 32) for im in pil_images(x)]), dtype=torch.float32)
    tokens = processor.tokenizer(prompts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixels).pooler_output
        text = model.get_text_features(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).pooler_output
    return F.normalize(image, dim=-1), F.normalize(text, dim=-1), model.logit_scale.exp().item()


def head_by_hand(state: dict, e: torch.Tensor) -> torch.Tensor:
    """The published head is five affine maps (dropout is off at inference): apply them one by one."""
    for i in (0, 2, 4, 6, 7):
        e = e @ state[f"layers.{i}.weight"].T + state[f"layers.{i}.bias"]
    return e.squeeze(-1)


@pytest.mark.parametrize("kind", KINDS)
def test_scores_equal_the_published_pipeline(kind, clip_dir, head_file):
    x = images(4, 64, 64)  # a 2x downscale, where the tensor preprocessing equals PIL's exactly
    prompts = PROMPTS[:4]
    image, text, scale = reference_embeddings(clip_dir, x, prompts, "pad" if kind == "hpsv2" else "crop")
    cosine = (image * text).sum(-1)
    expected = {"pickscore": lambda: scale * cosine, "hpsv2": lambda: cosine,
                "clip_score": lambda: (100 * cosine).clamp(min=0),
                "aesthetic": lambda: head_by_hand(torch.load(head_file, weights_only=True), image)}[kind]()
    torch.testing.assert_close(make(kind, clip_dir, head_file).score(x, prompts), expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def constant_dirs(tmp_path_factory):
    """Models whose image embedding is (3, 4, 0, ...) and text embedding is the same, its negative, or orthogonal."""
    v = torch.zeros(PROJECTION_DIM)
    v[:2] = torch.tensor([3.0, 4.0])
    w = torch.zeros(PROJECTION_DIM)
    w[5] = 2.0
    return {name: str(set_constant_embeddings(save_tiny_clip(tmp_path_factory.mktemp(name)), v, t, logit_scale=20.0))
            for name, t in (("same", v), ("opposite", -v), ("orthogonal", w))}


@pytest.mark.parametrize("text, pickscore, hps, clip_score", [
    ("same", 20.0, 1.0, 100.0),          # cos = 1: logit_scale.exp() = 20; HPS = cos; 100 * cos
    ("opposite", -20.0, -1.0, 0.0),      # cos = -1: CLIPScore clamps 100 * cos at 0
    ("orthogonal", 0.0, 0.0, 0.0),       # cos = 0
])
def test_hand_checkable_scores(constant_dirs, text, pickscore, hps, clip_score):
    path, x = constant_dirs[text], images(3)
    prompts = ["cat", "a red dog", ""]
    for reward, value in ((PickScore(model=path, processor=path), pickscore),
                          (HPSv2(model=path, processor=None), hps), (CLIPScore(model=path), clip_score)):
        torch.testing.assert_close(reward.score(x, prompts), torch.full((3,), value), rtol=1e-5, atol=1e-5)


def test_aesthetic_head_on_a_known_embedding(constant_dirs, tmp_path):
    # Every image embeds to (3, 4, 0, ...) / 5 = (0.6, 0.8, 0, ...). Head: layer 0 reads 1 * 0.6 + 2 * 0.8 = 2.2
    # into unit 0, layers 2/4/6 copy unit 0, layer 7 gives 0.5 * 2.2 + 5 = 6.1.
    head = AestheticHead(PROJECTION_DIM)
    state = {k: torch.zeros_like(v) for k, v in head.state_dict().items()}
    state["layers.0.weight"][0, :2] = torch.tensor([1.0, 2.0])
    for i in (2, 4, 6):
        state[f"layers.{i}.weight"][0, 0] = 1.0
    state["layers.7.weight"][0, 0], state["layers.7.bias"][0] = 0.5, 5.0
    torch.save(state, tmp_path / "head.pth")
    reward = Aesthetic(model=constant_dirs["same"], head=str(tmp_path / "head.pth"))
    torch.testing.assert_close(reward.score(images(2), ["", ""]), torch.tensor([6.1, 6.1]))


def test_aesthetic_head_has_the_published_layout(tmp_path):
    head = AestheticHead()
    assert list(head.state_dict()) == [f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")]
    assert [tuple(head.state_dict()[f"layers.{i}.weight"].shape) for i in (0, 2, 4, 6, 7)] == \
        [(1024, 768), (128, 1024), (64, 128), (16, 64), (1, 16)]
    with pytest.raises(RuntimeError, match="Missing key"):
        AestheticHead.from_state_dict({k: v for k, v in head.state_dict().items() if k != "layers.7.bias"})


def test_aesthetic_head_of_the_wrong_width_fails_at_load(clip_dir, tmp_path):
    torch.save(AestheticHead(768).state_dict(), tmp_path / "vit-l.pth")
    with pytest.raises(ValueError, match="takes 768-d embeddings .* projects to 16"):
        Aesthetic(model=clip_dir, head=str(tmp_path / "vit-l.pth")).load()


@pytest.mark.parametrize("kind", KINDS)
def test_dtype_is_honoured(kind, clip_dir, head_file):
    x = images(4)
    full = make(kind, clip_dir, head_file).score(x, PROMPTS[:4])
    reward = make(kind, clip_dir, head_file, dtype="bfloat16")
    half = reward.score(x, PROMPTS[:4])
    assert reward.model.dtype == torch.bfloat16 and reward.pixel_values(x).dtype == torch.bfloat16
    assert half.dtype == torch.float32 and not torch.equal(half, full)
    assert (half - full).abs().max() <= 0.05 * full.abs().max() + 1e-3  # bf16 keeps ~3 significant digits


def test_setup_loads_once_on_the_module_device(clip_dir):
    reward = PickScore(model=clip_dir, processor=clip_dir)
    assert reward.model is None  # nothing loads at construction
    module = SimpleNamespace(device=torch.device("cpu"))
    reward.setup(None, module, "fit")
    model = reward.model
    reward.setup(None, module, "validate")
    assert reward.model is model and reward.model_device == torch.device("cpu")
    assert not any(p.requires_grad for p in model.parameters()) and not model.training


def test_bad_configuration_fails_at_construction(clip_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PickScore(model=str(tmp_path / "missing"), processor=clip_dir)
    with pytest.raises(FileNotFoundError, match="org/repo/filename"):
        Aesthetic(model=clip_dir, head=str(tmp_path / "missing.pth"))
    with pytest.raises(FileNotFoundError, match="org/repo/filename"):
        HPSv2(model=str(tmp_path / "HPS_v2.pt"))
    with pytest.raises(ValueError, match=r"version='v3'.*\['v2.0', 'v2.1'\]"):
        HPSv2(version="v3")
    with pytest.raises(ValueError, match="dtype='float8'"):
        PickScore(model=clip_dir, processor=clip_dir, dtype="float8")


def test_hps_version_picks_the_published_checkpoint():
    # Construction only records the address; nothing is downloaded until the weights load.
    assert HPSv2().model_id == "xswu/HPSv2/HPS_v2.1_compressed.pt"
    assert HPSv2(version="v2.0").model_id == "xswu/HPSv2/HPS_v2_compressed.pt"
    assert PickScore().model_id == "yuvalkirstain/PickScore_v1"
    assert PickScore().processor_id == "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def test_clip_score_equals_torchmetrics_metric_per_image(clip_dir):
    from torchmetrics.multimodal import CLIPScore as CLIPScoreMetric

    reward = CLIPScore(model=clip_dir)
    x = images(4)
    scores = reward.score(x, PROMPTS[:4])
    for i in range(4):  # the public metric, one image at a time, through its callable model_name_or_path form
        metric = CLIPScoreMetric(model_name_or_path=lambda: (FeatureCLIP(reward.model), TensorProcessor(reward)))
        metric.update(x[i:i + 1], [PROMPTS[i]])
        torch.testing.assert_close(metric.compute(), scores[i], rtol=1e-5, atol=1e-5)
