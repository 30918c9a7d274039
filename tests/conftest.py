"""Shared fixtures: a random-weight tiny model saved in diffusers layout, loaded through ``from_pretrained``."""

import os

import pytest
import torch


def pytest_configure(config):
    """Under pytest-xdist (``-n 2``: one worker per core) every worker and the processes it starts use one torch
    thread: two workers of two threads each on two cores would oversubscribe them, and tiny models gain nothing from a
    second thread."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def untagged_groups(items) -> list[str]:
    """The tests marked ``xdist_group`` whose id lacks the ``@group`` suffix pytest-xdist's ``--dist loadgroup`` adds
    to keep a group on one worker (it sets ``item._nodeid``; pytest 9.2 derives ``nodeid`` from elsewhere, so the
    suffix, and with it the grouping, silently vanished: every group's fixture was built once per worker)."""
    return [item.nodeid for item in items if any(item.iter_markers("xdist_group")) and "@" not in item.nodeid]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from flowrl.policies.tiny_components import build_components, save_components

    torch.manual_seed(0)
    return str(save_components(build_components(num_layers=1, text_layers=1), tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="session")
def sd3_dir(tmp_path_factory):
    """A random-weight tiny SD3 pipeline saved in diffusers layout (``tests/policies/tiny_pipelines.py``)."""
    from diffusers import StableDiffusion3Pipeline

    from tests.policies.tiny_pipelines import save_pipeline, sd3_components

    return str(save_pipeline(StableDiffusion3Pipeline, sd3_components, tmp_path_factory.mktemp("sd3")))


@pytest.fixture(scope="session")
def qwen_image_dir(tmp_path_factory):
    from diffusers import QwenImagePipeline

    from tests.policies.tiny_families import qwen_image_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(QwenImagePipeline, qwen_image_components, tmp_path_factory.mktemp("qwen_image")))


@pytest.fixture(scope="session")
def qwen_image21_dir(tmp_path_factory):
    """Qwen-Image 2.1: Qwen3-VL prompts, a single-stream block-causal transformer, the 16x RGBA VAE."""
    from diffusers import QwenImage21Pipeline

    from tests.policies.tiny_pipelines import save_pipeline
    from tests.policies.tiny_qwen21 import qwen_image21_components

    return str(save_pipeline(QwenImage21Pipeline, qwen_image21_components, tmp_path_factory.mktemp("qwen_image21")))


@pytest.fixture(scope="session")
def flux_kontext_dir(tmp_path_factory):
    from diffusers import FluxKontextPipeline

    from tests.policies.tiny_editing import flux_kontext_components
    from tests.policies.tiny_pipelines import save_pipeline

    return str(save_pipeline(FluxKontextPipeline, flux_kontext_components, tmp_path_factory.mktemp("flux_kontext")))


@pytest.fixture(scope="session")
def wan_dirs(tmp_path_factory):
    """Tiny Wan pipelines: ``wan21``, ``wan22`` (two experts, UniPC), ``wan22_euler``, ``wan21_i2v``, ``wan22_i2v``,
    ``ti2v``."""
    from tests.policies.tiny_wan import save_all

    return save_all(tmp_path_factory.mktemp("wan"))


#: the tiny models the 2-process fits of tests/two_process_group.py read: {name: the session fixture that saves it}
TINY_MODELS = {"tiny": "tiny_model_dir", "sd3": "sd3_dir", "qwen_image": "qwen_image_dir",
               "qwen_image21": "qwen_image21_dir", "flux_kontext": "flux_kontext_dir", "wan": "wan_dirs"}


class TinyModels(dict):
    """The tiny models' folders by name (:data:`TINY_MODELS`), each saved by its fixture when a module first asks."""

    def __init__(self, request):
        super().__init__()
        self.request = request

    def __missing__(self, name: str):
        self[name] = self.request.getfixturevalue(TINY_MODELS[name])
        return self[name]


@pytest.fixture(scope="session")
def two_process_fits(request, tmp_path_factory):
    """The folder of every 2-process fit of the tiny model and the tiny SD3, Qwen-Image (1 and 2.1), FLUX.1 Kontext
    and Wan pipelines, with their 1-process references, run once (``tests/two_process_group.py``): those of the modules
    whose tests this run selected (one file run alone fits its own, and saves only the models it reads); its tests
    carry ``tests.two_process_group.GROUP``."""
    from tests.two_process_group import MODULES, run_every_fit

    selected = {item.module.__name__ for item in request.session.items
                if "two_process_fits" in getattr(item, "fixturenames", ())}
    return run_every_fit(tmp_path_factory.mktemp("two_process_group"), TinyModels(request),
                         tuple(name for name in MODULES if name in selected))


DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")


@pytest.fixture(autouse=True)
def no_process_group_outlives_a_test():
    """A test that runs a distributed strategy in pytest's own process leaves no process group (its store keeps the
    port listening) and none of the variables Lightning sets: every later multi-process test would inherit the port
    and fail with EADDRINUSE."""
    before = {name: os.environ.get(name) for name in DIST_ENV}
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
