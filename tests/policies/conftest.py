"""Tiny random-weight pipelines (FLUX.1, SD1.5, FLUX.2 [klein] and [dev], Z-Image, Wan, LTX-2, HunyuanVideo 1.5, and
the editing family Qwen-Image-Edit(-Plus)) saved once per session; SD3's, Qwen-Image's, Qwen-Image 2.1's and FLUX.1
Kontext's (which the suite's one group of 2-process fits uses too: ``tests/two_process_group.py``) are in
``tests/conftest.py``."""

import pytest


@pytest.fixture(scope="session")
def flux_dir(tmp_path_factory):
    from diffusers import FluxPipeline

    from tests.policies.tiny_pipelines import flux_components, save_pipeline

    return str(save_pipeline(FluxPipeline, flux_components, tmp_path_factory.mktemp("flux")))


@pytest.fixture(scope="session")
def sd15_dir(tmp_path_factory):
    from tests.policies.tiny_sd15 import save_sd15

    return str(save_sd15(tmp_path_factory.mktemp("sd15")))


@pytest.fixture(scope="session")
def flux2_dir(tmp_path_factory):
    """FLUX.2 [klein] base: sampled with CFG (``is_distilled`` false, the pipeline's default)."""
    from diffusers import Flux2KleinPipeline

    from tests.policies.tiny_families import flux2_klein_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(Flux2KleinPipeline, flux2_klein_components, tmp_path_factory.mktemp("flux2")))


@pytest.fixture(scope="session")
def flux2_distilled_dir(flux2_dir, tmp_path_factory):
    """The same weights as a step-distilled FLUX.2 [klein] (``is_distilled`` true: no CFG)."""
    from pathlib import Path

    from tests.policies.tiny_families import set_distilled

    return str(set_distilled(Path(flux2_dir), tmp_path_factory.mktemp("flux2_distilled") / "model", True))


@pytest.fixture(scope="session")
def zimage_dir(tmp_path_factory):
    from diffusers import ZImagePipeline

    from tests.policies.tiny_families import zimage_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(ZImagePipeline, zimage_components, tmp_path_factory.mktemp("zimage")))


@pytest.fixture(scope="session")
def flux2_dev_dir(tmp_path_factory):
    """FLUX.2 [dev]: Flux2Pipeline, Mistral3 text encoder, guidance embedded (no CFG)."""
    from diffusers import Flux2Pipeline

    from tests.policies.tiny_families import flux2_dev_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(Flux2Pipeline, flux2_dev_components, tmp_path_factory.mktemp("flux2_dev")))


@pytest.fixture(scope="session")
def ltx2_dir(tmp_path_factory):
    """LTX-2: Gemma-3 prompts through the connectors, the joint audio-video transformer, the video and audio VAEs."""
    from diffusers import LTX2Pipeline

    from tests.policies.tiny_ltx2 import ltx2_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(LTX2Pipeline, ltx2_components, tmp_path_factory.mktemp("ltx2")))


@pytest.fixture
def refuse_weights(monkeypatch):
    """Loading any diffusers model's weights fails: what a test then sees was found from the configs alone."""
    from diffusers import ModelMixin

    def refuse(cls, *args, **kwargs):
        raise AssertionError(f"{cls.__name__} weights loaded before the options were checked")

    monkeypatch.setattr(ModelMixin, "from_pretrained", classmethod(refuse))


@pytest.fixture(scope="session")
def hunyuan15_dirs(tmp_path_factory):
    """Tiny HunyuanVideo 1.5 pipelines: ``hunyuan15_t2v`` and ``hunyuan15_i2v`` (SigLIP first frames)."""
    from tests.policies.fidelity import hunyuan15_folders

    return hunyuan15_folders(tmp_path_factory.mktemp("hunyuan15"))


@pytest.fixture(scope="session")
def qwen_edit_plus_dir(tmp_path_factory):
    """Qwen-Image-Edit-Plus (2509): one or more source images per prompt."""
    from diffusers import QwenImageEditPlusPipeline

    from tests.policies.tiny_editing import qwen_image_edit_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(QwenImageEditPlusPipeline, qwen_image_edit_components,
                             tmp_path_factory.mktemp("qwen_edit_plus")))


@pytest.fixture(scope="session")
def qwen_edit_dir(tmp_path_factory):
    """Qwen-Image-Edit (the first release): one source image per prompt, read by the vision tower at the VAE size."""
    from diffusers import QwenImageEditPipeline

    from tests.policies.tiny_editing import qwen_image_edit_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(QwenImageEditPipeline, qwen_image_edit_components, tmp_path_factory.mktemp("qwen_edit")))
