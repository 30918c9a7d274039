"""The feature spaces of drift and diversity: the digit classifier's penultimate features are what its heads read,
a CLIP reward's are its unit-norm image embeddings, and ``--features auto`` picks the first metric that has some."""

import torch

from flowrl.evaluation.features import feature_reward
from flowrl.rewards import DigitAlignment, JpegCompressibility, PickScore
from tests.rewards.tiny_clip import save_tiny_clip


def test_the_digit_classifier_features_are_what_its_heads_read():
    reward = DigitAlignment().load("cpu")
    images = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    features = reward.image_features(images)
    assert features.shape == (4, 128)
    logits = reward.model(images)
    for name, head in reward.model.heads.items():
        torch.testing.assert_close(head(features), logits[name])


def test_a_clip_rewards_features_are_its_image_embeddings(tmp_path):
    path = str(save_tiny_clip(tmp_path / "clip"))
    reward = PickScore(model=path, processor=path)
    images = torch.rand(3, 3, 40, 48, generator=torch.Generator().manual_seed(1))
    features = reward.image_features(images)
    torch.testing.assert_close(features, reward.image_embeddings(images))
    torch.testing.assert_close(features.norm(dim=1), torch.ones(3))
    jpeg = JpegCompressibility()
    assert feature_reward("auto", [jpeg, reward]) is reward
    assert feature_reward("none", [jpeg, reward]) is None and feature_reward("auto", [jpeg]) is None
