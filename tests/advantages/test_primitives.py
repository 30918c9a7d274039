"""Primitives: keyed normalisation under every std scope, singletons, whitening, returns with holes, GAE."""

import pytest
import torch

from flowrl.advantages import primitives as P

X = torch.tensor([1.0, 2.0, 3.0, 10.0, 14.0])
KEYS = torch.tensor([0, 0, 0, 1, 1])


def approx(values):
    return pytest.approx(values, abs=1e-5)


def test_normalize_under_each_std_scope():
    # group means 2 and 12; unbiased group stds 1 and sqrt(8)
    assert P.normalize(X, KEYS, eps=0.0).tolist() == approx([-1, 0, 1, -2 / 8 ** 0.5, 2 / 8 ** 0.5])
    # global: std of all five (mean 6; squares 25 16 9 16 64 = 130; / 4) = sqrt(32.5)
    centered = [-1, 0, 1, -2, 2]
    glob = [c / 32.5 ** 0.5 for c in centered]
    assert P.normalize(X, KEYS, eps=0.0, std_scope="global").tolist() == approx(glob)
    assert P.normalize(X, KEYS, eps=0.0, std_scope="batch").tolist() == approx(glob)  # no batch keys: all
    # batch keys [0 1 0 1 0]: pooled {1, 3, 14} (mean 6, var 98/2 -> std 7) and {2, 10} (mean 6, std sqrt(32))
    pooled = P.normalize(X, KEYS, eps=0.0, std_scope="batch", batch_keys=torch.tensor([0, 1, 0, 1, 0]))
    assert pooled.tolist() == approx([-1 / 7, 0, 1 / 7, -2 / 32 ** 0.5, 2 / 7])
    assert P.normalize(X, KEYS, std_scope="none").tolist() == approx(centered)


def test_normalize_singletons_and_ties():
    x, keys = torch.tensor([5.0, 3.0, 3.0]), torch.tensor([0, 1, 1])
    # the singleton: raw is mean 0 and std 1 (verl): 5 / (1 + eps); the tied pair has zero std -> 0
    assert P.normalize(x, keys, eps=0.25).tolist() == [4.0, 0.0, 0.0]
    assert P.normalize(x, keys, eps=0.25, std_scope="none").tolist() == [5.0, 0.0, 0.0]
    assert P.normalize(x, keys, eps=0.0, singleton="zero").tolist() == [0.0, 0.0, 0.0]


def test_normalize_with_composite_keys():
    # (group, step) keys: entries 0 and 2 share (7, 0), entry 1 is alone
    keys = torch.tensor([[7, 0], [7, 1], [7, 0]])
    assert P.normalize(torch.tensor([1.0, 5.0, 3.0]), keys, eps=0.0, ddof=0).tolist() == [-1.0, 5.0, 1.0]


def test_masked_whiten():
    x, m = torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[True, True, False]])
    # mean 2; unbiased var (1 + 1) / 1 = 2; population var 1
    assert P.masked_whiten(x, m, eps=0.0)[0].tolist() == approx([-(0.5 ** 0.5), 0.5 ** 0.5, 0.0])
    assert P.masked_whiten(x, m, ddof=0, eps=0.0).tolist() == [[-1.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="more than ddof=1 valid positions"):
        P.masked_whiten(x, torch.tensor([[True, False, False]]))


def test_discounted_returns_skip_or_reset_holes():
    r, m = torch.tensor([[1.0, 5.0, 2.0, 3.0]]), torch.tensor([[True, False, True, True]])
    # G3 = 3; G2 = 2 + .5 * 3 = 3.5; skip: G0 = 1 + .5 * 3.5 = 2.75 (the hole is transparent); reset: G0 = 1
    assert P.discounted_returns(r, m, 0.5, "skip").tolist() == [[2.75, 0.0, 3.5, 3.0]]
    assert P.discounted_returns(r, m, 0.5, "reset").tolist() == [[1.0, 0.0, 3.5, 3.0]]
    padded = torch.tensor([[True, True, True, False]])  # right padding only: the two agree
    # G2 = 2; G1 = 5 + .5 * 2 = 6; G0 = 1 + .5 * 6 = 4
    assert P.discounted_returns(r, padded, 0.5, "skip").tolist() == [[4.0, 6.0, 2.0, 0.0]]
    assert P.discounted_returns(r, padded, 0.5, "reset").tolist() == [[4.0, 6.0, 2.0, 0.0]]
    with pytest.raises(ValueError, match="holes='keep'"):
        P.discounted_returns(r, m, 0.5, "keep")


def test_generalized_advantages_skip_holes():
    r, v = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.25]])
    m = torch.tensor([[True, False, True]])
    # t2: delta = 1 - .25 = .75; t1 is a hole (V = 9 never used); t0: delta = .9 * .25 - .5 = -.275,
    # A0 = -.275 + .9 * .8 * .75 = .265
    assert P.generalized_advantages(r, v, m, gamma=0.9, lam=0.8)[0].tolist() == approx([0.265, 0.0, 0.75])


def test_scores_ignore_masked_nan():
    r = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    m = torch.tensor([[True, False], [True, True]])
    assert P.scores(r, m).tolist() == [1.0, 5.0]
