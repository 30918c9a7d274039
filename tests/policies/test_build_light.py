"""Every family's policy builds from its configs alone: what the checks and the data need before loading is known,
every bad option is reported at once, and the weights load once, in ``load()``."""

import json
from pathlib import Path

import pytest
import torch

from flowrl.policies import (Flux2Policy, FluxKontextPolicy, FluxPolicy, HunyuanVideo15I2VPolicy,
                             HunyuanVideo15Policy, LTX2I2VPolicy, LTX2Policy, QwenImage21Policy, QwenImageEditPolicy, QwenImagePolicy,
                             SD3Policy, SD15Policy, TinyFlowPolicy, WanI2VPolicy, WanPolicy, ZImagePolicy)
from flowrl.policies.base import LoraOptions

LORA = LoraOptions(rank=4, alpha=8)
VIDEO = {"height": 16, "width": 16, "num_frames": 5}
HY15 = {"height": 12, "width": 16, "num_frames": 5}  # a size bucket of the tiny HunyuanVideo 1.5

# (policy class, folder fixture (a key of wan_dirs after ":"), options, expected latent shape, guidance kind,
# conditioning images, prediction)
ROOT = Path(__file__).resolve().parents[2]
FAMILIES = {
    "tiny": (TinyFlowPolicy, "tiny_model_dir", {}, (3, 16, 16), "cfg", 0, "velocity"),
    "sd3": (SD3Policy, "sd3_dir", {"resolution": 32, "max_sequence_length": 8}, None, "cfg", 0, "velocity"),
    "flux": (FluxPolicy, "flux_dir", {"resolution": 32, "max_sequence_length": 8}, None, "embedded", 0,
             "velocity"),
    "flux_kontext": (FluxKontextPolicy, "flux_kontext_dir", {"resolution": 32, "source_area": 32 * 32},
                     None, "embedded", 1, "velocity"),
    "sd15": (SD15Policy, "sd15_dir", {"resolution": 32}, None, "cfg", 0, "epsilon"),
    "flux2": (Flux2Policy, "flux2_dir", {"resolution": 32, "max_sequence_length": 16}, None, "cfg", 0, "velocity"),
    "flux2_dev": (Flux2Policy, "flux2_dev_dir", {"resolution": 32, "max_sequence_length": 16}, None, "embedded", 0,
                  "velocity"),
    "qwen_image": (QwenImagePolicy, "qwen_image_dir", {"resolution": 32, "max_sequence_length": 16}, None, "cfg", 0,
                   "velocity"),
    "qwen_image_edit": (QwenImageEditPolicy, "qwen_edit_plus_dir", {"resolution": 32, "source_area": 32 * 32},
                        None, "cfg", -1, "velocity"),
    "qwen_image21": (QwenImage21Policy, "qwen_image21_dir", {"resolution": 64}, (8, 4, 4), "cfg", 0, "velocity"),
    "z_image": (ZImagePolicy, "zimage_dir", {"resolution": 32, "max_sequence_length": 32}, None, "cfg", 0,
                "velocity"),
    "wan": (WanPolicy, "wan_dirs:wan21", {**VIDEO, "max_sequence_length": 16}, None, "cfg", 0, "velocity"),
    "wan_experts": (WanPolicy, "wan_dirs:wan22", {**VIDEO, "max_sequence_length": 16}, None, "cfg", 0, "velocity"),
    "wan_i2v": (WanI2VPolicy, "wan_dirs:wan21_i2v", {**VIDEO, "max_sequence_length": 512}, None, "cfg", 1,
                "velocity"),
    # LTX-2's joint audio-video state, one flat vector: 3 x 16 x 16 video tokens of 4, then 4 audio tokens of 4
    "ltx2": (LTX2Policy, "ltx2_dir", {"height": 32, "width": 32, "num_frames": 5, "frame_rate": 30.0,
                                      "max_sequence_length": 16}, (3088,), "cfg", 0, "velocity"),
    # image-to-video: the first latent frame (16 x 16 tokens of 4) kept out of the state
    "ltx2_i2v": (LTX2I2VPolicy, "ltx2_dir", {"height": 32, "width": 32, "num_frames": 5, "frame_rate": 30.0,
                                             "max_sequence_length": 16, "image_crf": 0}, (2064,), "cfg", 1, "velocity"),
    "hunyuan15": (HunyuanVideo15Policy, "hunyuan15_dirs:hunyuan15_t2v", HY15, (4, 3, 3, 4), "cfg", 0, "velocity"),
    "hunyuan15_i2v": (HunyuanVideo15I2VPolicy, "hunyuan15_dirs:hunyuan15_i2v", HY15, (4, 3, 3, 4), "cfg", 1,
                      "velocity"),
}

# per family, two bad options (one of them one the family used to check only after its VAE loaded)
BAD = {
    "sd3": {"resolution": 33, "torch_dtype": "bf16"},
    "flux": {"resolution": 33, "autocast": "fp8"},
    "flux_kontext": {"resolution": 33, "source_area": 10, "image_cache_size": -1},
    "sd15": {"resolution": 33, "vae_chunk_size": 0},
    "flux2": {"resolution": 33, "max_sequence_length": 0, "prompt_cache_size": -1},
    "flux2_dev": {"resolution": 33, "torch_dtype": "bf16"},
    "qwen_image": {"resolution": 33, "torch_dtype": "bf16"},
    "qwen_image_edit": {"condition_area": 10, "image_cache_size": -1, "torch_dtype": "bf16"},
    "qwen_image21": {"resolution": 48, "vae_chunk_size": 0},  # 48: a multiple of 16, not of the 32 2.1 needs
    "z_image": {"resolution": 33, "cfg_normalization": -1.0, "vae_chunk_size": 0},
    "wan": {"width": 17, "flow_shift": -1.0, "trained_experts": ["transformer_3"]},
    "wan_experts": {"num_frames": 6, "trained_experts": [], "torch_dtype": "bf16"},
    "wan_i2v": {"width": 17, "max_sequence_length": 16, "image_cache_size": -1},
    "ltx2": {"height": 48, "frame_rate": 0.0, "guidance_rescale": 2.0},
    "ltx2_i2v": {"width": 48, "image_crf": -1, "image_cache_size": -1},
    "hunyuan15": {"width": 17, "flow_shift": -1.0, "vae_chunk_size": 0, "max_sequence_length": 0},
    "hunyuan15_i2v": {"width": 24, "num_frames": 6, "image_cache_size": -1},  # 12 x 24: no bucket of target size 16
}


@pytest.fixture
def no_weights(monkeypatch):
    """Loading any diffusers or transformers model's weights fails the test."""
    from diffusers import ModelMixin
    from transformers import PreTrainedModel

    def refuse(cls, *args, **kwargs):
        raise AssertionError(f"{cls.__name__} weights loaded while building the policy")

    monkeypatch.setattr(ModelMixin, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


def folder(request, fixture: str) -> str:
    name, _, key = fixture.partition(":")
    found = request.getfixturevalue(name)
    return found[key] if key else found


def build(family: str, request, **options):
    cls, fixture, given = FAMILIES[family][:3]
    return cls(folder(request, fixture), **{"lora": LORA, **given, **options})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_builds_from_configs_alone(family, request, no_weights):
    _, _, _, shape, guidance, images, prediction = FAMILIES[family]
    policy = build(family, request)
    assert not policy.loaded and policy.denoiser is None
    assert not list(policy.parameters())
    assert policy.guidance_kind == guidance and policy.conditioning_images == images
    assert policy.prediction == prediction
    assert policy.sharded_blocks and policy.lora_targets
    if shape is not None:
        assert policy.latent_shape() == shape
    assert len(policy.latent_shape()) in (1, 3, 4)  # [C, h, w] images, [C, f, h, w] videos, [N] LTX-2's joint state
    sigmas = policy.sigmas(4)
    assert sigmas.shape == (5,) and bool((sigmas[:-1] > sigmas[1:]).all())


@pytest.mark.parametrize("family", list(BAD))
def test_every_bad_option_reported_together_before_any_weight(family, request, no_weights):
    with pytest.raises(ValueError) as err:
        build(family, request, **BAD[family])
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == len(BAD[family]), str(err.value)
    for key in BAD[family]:
        assert any(f"policy.{key}" in line for line in lines), (key, str(err.value))


@pytest.mark.parametrize("family", list(BAD))
def test_a_bad_policy_option_is_reported_by_the_cli_with_the_runs_other_problems(family, request, tmp_path, capsys,
                                                                                monkeypatch):
    # the policy's problems (PolicyOptionsError, raised while jsonargparse builds it) join the method's and the
    # data's in one list, and no weight loads (from_pretrained and FlowPolicy.load refused)
    from flowrl.cli import main
    from tests.cli.no_weights import refuse_weights

    refuse_weights(monkeypatch)
    cls, fixture, given = FAMILIES[family][:3]
    policy = {"class_path": f"{cls.__module__}.{cls.__name__}",
              "init_args": {"model": folder(request, fixture), **given, **BAD[family]}}
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(ROOT / "configs" / "tiny_flow_grpo.yaml"), f"--trainer.default_root_dir={tmp_path}",
              f"--model.init_args.policy={json.dumps(policy)}", "--model.init_args.num_steps=0", "--data.group_size=1"])
    text = str(err.value)
    assert text.startswith("flowrl: invalid configuration:"), text
    for key in BAD[family]:
        assert f"model.init_args.policy.init_args.{key}" in text, (key, text)
    assert "model.num_steps=0 must be >= 1" in text and "group_size=1" in text, text


def plain(value):
    return list(map(plain, value)) if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("family", ["tiny", "sd3", "sd15", "flux2", "qwen_image", "wan_experts", "ltx2"])
def test_load_is_idempotent_and_the_configs_are_the_loaded_models(family, request):
    policy = build(family, request)
    assert policy.load() is policy and policy.loaded
    weights = {name: p.clone() for name, p in policy.named_parameters()}
    assert policy.load() is policy
    assert [n for n, _ in policy.named_parameters()] == list(weights)
    assert all(torch.equal(p, weights[n]) for n, p in policy.named_parameters())
    assert policy.adapter_names == ["default"] and policy.trainable_parameters()
    assert type(policy.denoiser).__name__ == policy.denoiser_kind
    # what latent_shape() and the checks read before loading is what the loaded models were built with
    for built, loaded in ((policy.denoiser_config, policy.denoiser.config),
                          (getattr(policy, "vae_config", {}), getattr(getattr(policy, "vae", None), "config", {}))):
        shared = [k for k in loaded if k in built and not k.startswith("_")]
        assert shared or not loaded
        assert all(plain(built[k]) == plain(loaded[k]) for k in shared), family


def test_lora_initialisation_is_that_of_loading_when_built(tiny_model_dir):
    """Random draws between building and loading change nothing: LoRA draws from the RNG as it was at building."""
    torch.manual_seed(0)
    direct = TinyFlowPolicy(tiny_model_dir).load()
    torch.manual_seed(0)
    later = TinyFlowPolicy(tiny_model_dir)
    torch.randn(1000)  # what runs between building and configure_model
    later.load()
    assert all(torch.equal(a, b) for a, b in zip(direct.trainable_parameters(), later.trainable_parameters()))


@pytest.mark.parametrize("family", ["tiny", "sd3", "sd15", "flux2", "qwen_image", "wan_experts", "ltx2",
                                    "hunyuan15"])
def test_the_skeleton_has_the_loaded_denoisers_modules(family, request, monkeypatch):
    """What a check reads before loading (the denoiser built on the meta device from its config) names the modules the
    loaded denoiser has, each LoRA file's network alike (Wan 2.2 writes one per expert)."""
    from diffusers import ModelMixin

    from flowrl.policies.export import lora_modules
    from flowrl.policies.skeleton import denoiser_module_names

    policy = build(family, request)
    with monkeypatch.context() as m:  # no weights behind the skeleton
        m.setattr(ModelMixin, "from_pretrained", classmethod(lambda *a, **k: pytest.fail("weights loaded")))
        names = denoiser_module_names(policy)
    policy.load()
    for network in lora_modules(policy).values():
        loaded = {n for n, _ in network.named_modules() if not any(p in n for p in ("lora_", "base_layer"))}
        assert names == loaded, family
