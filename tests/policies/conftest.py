"""Tiny random-weight SD3, FLUX.1, SD1.5 and Wan pipelines saved once per session."""

import pytest


@pytest.fixture(scope="session")
def sd3_dir(tmp_path_factory):
    from diffusers import StableDiffusion3Pipeline

    from tests.policies.tiny_pipelines import save_pipeline, sd3_components

    return str(save_pipeline(StableDiffusion3Pipeline, sd3_components, tmp_path_factory.mktemp("sd3")))


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
def wan_dirs(tmp_path_factory):
    """Tiny Wan pipelines: ``wan21``, ``wan22`` (two experts, UniPC), ``wan22_euler``, ``wan21_i2v``, ``wan22_i2v``,
    ``ti2v``."""
    from tests.policies.tiny_wan import save_all

    return save_all(tmp_path_factory.mktemp("wan"))
