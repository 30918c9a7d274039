"""The hacking signals on constructed scores: distances by hand, and the flag raised when a trained reward rises
while a held-out reward or the diversity falls beyond its interval, and not when the gain is benign."""

import numpy as np
import torch

from flowrl.evaluation.metrics import Metrics
from flowrl.evaluation.results import Table, analyse
from flowrl.evaluation.signals import feature_distance, mean_pairwise, pixel_distance
from flowrl.rewards import FunctionReward

P, S = 40, 4


def metrics() -> Metrics:
    rewards = [FunctionReward("tests.rewards.reward_functions.brightness"),
               FunctionReward("tests.rewards.reward_functions.prompt_lengths", name="alignment")]
    return Metrics(rewards, trained={"tuned": ["brightness"]})


def table(brightness_gain: float, alignment_change: float, diversity_change: float = 0.0) -> Table:
    """Base scores with prompt-to-prompt spread; the tuned model's are the base's plus a change and small noise."""
    rng = np.random.default_rng(0)
    base_b, base_a = rng.uniform(0.1, 0.3, (P, S)), rng.uniform(0.2, 0.8, (P, S))
    noise = lambda: rng.normal(0, 0.02, (P, S))  # noqa: E731
    t = Table(["base", "tuned"], list(range(S)))
    t.scores = {("brightness", "base"): base_b, ("brightness", "tuned"): base_b + brightness_gain + noise(),
                ("alignment", "base"): base_a, ("alignment", "tuned"): base_a + alignment_change + noise()}
    diversity = rng.uniform(0.1, 0.2, (P, 1))
    t.diversity = {("pixels", "base"): diversity,
                   ("pixels", "tuned"): diversity + diversity_change + rng.normal(0, 0.005, (P, 1))}
    return t


def flag(t: Table, margin: float = 0.0):
    return analyse(t, metrics(), [None] * P, resamples=2000, margin=margin).flags["tuned"]


def test_raised_when_the_trained_reward_rises_and_a_held_out_one_falls():
    f = flag(table(brightness_gain=0.2, alignment_change=-0.1))
    assert f.raised and list(f.gains) == ["brightness"] and list(f.falls) == ["alignment"]


def test_raised_when_the_diversity_collapses():
    f = flag(table(brightness_gain=0.2, alignment_change=0.0, diversity_change=-0.05))
    assert f.raised and list(f.falls) == ["diversity (pixels)"]


def test_not_raised_for_a_benign_gain():
    f = flag(table(brightness_gain=0.2, alignment_change=0.02))  # the held-out reward rose too
    assert not f.raised and list(f.gains) == ["brightness"] and not f.falls


def test_not_raised_when_the_held_out_fall_is_within_the_noise_or_the_trained_reward_did_not_rise():
    assert not flag(table(brightness_gain=0.2, alignment_change=-0.001)).raised  # inside its interval
    assert not flag(table(brightness_gain=0.0, alignment_change=-0.1)).raised  # worse, but not hacking: no gain


def test_the_margin_ignores_falls_smaller_than_a_share_of_the_base():
    # alignment's base mean is ~0.5: a fall of 0.01 is 2% of it; a margin of 5% asks for more
    t = table(brightness_gain=0.2, alignment_change=-0.01)
    assert flag(t).raised and not flag(t, margin=0.05).raised


def test_distances_by_hand():
    a = torch.zeros(1, 3, 2, 2)
    b = a.clone()
    b[0, 0, 0, 0] = 1.0  # one of 12 values differs by 1: RMS sqrt(1 / 12)
    assert torch.allclose(pixel_distance(a, b), torch.tensor([(1 / 12) ** 0.5]))
    # orthogonal features: 1; opposite: 2; the same direction at another length: exactly 0
    f = feature_distance(torch.tensor([[3.0, 0.0], [1.0, 1.0], [0.2, 0.7]]), torch.tensor([[0.0, 1.0], [-2.0, -2.0],
                                                                                           [0.4, 1.4]]))
    assert f.tolist() == [1.0, 2.0, 0.0]
    # the diversity of identical seeds is 0; of two images at RMS 0.5, with a third equal to one: (0.5+0.5+0)/3
    same = torch.full((3, 3, 2, 2), 0.3)
    assert mean_pairwise(same, pixel_distance) == 0.0
    mixed = torch.stack([torch.zeros(3, 2, 2), torch.full((3, 2, 2), 0.5), torch.zeros(3, 2, 2)])
    assert abs(mean_pairwise(mixed, pixel_distance) - 1 / 3) < 1e-7
