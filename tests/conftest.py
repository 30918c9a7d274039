"""Shared fixtures: a random-weight tiny model saved in diffusers layout, loaded through ``from_pretrained``."""

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from flowrl.policies.tiny_components import build_components, save_components

    torch.manual_seed(0)
    return str(save_components(build_components(num_layers=1, text_layers=1), tmp_path_factory.mktemp("tiny")))
