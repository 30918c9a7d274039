"""The registry: presets reproduce the peers, options and inputs are validated with messages naming the fix,
every estimator is importable, clip and masking apply to all of them."""

import pytest
import torch

from flowrl import advantages as adv

ESTIMATORS = ["dr_grpo", "gae", "gigpo", "gpg", "grpo", "grpo_passk", "opo", "prime", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline", "remax", "rloo", "step_grpo", "stratified_grpo", "tree"]


def column(values):
    return torch.tensor(values, dtype=torch.float32)[:, None]


def inputs(b, t, seed=0):
    """Every optional input, random, for a [b, t] batch."""
    gen = torch.Generator().manual_seed(seed)
    return dict(values=torch.randn(b, t, generator=gen), baselines=torch.randn(b, generator=gen),
                step_group_ids=torch.arange(b * t).view(b, t), stratum_ids=torch.arange(b) % 2,
                process_rewards=torch.randn(b, t, generator=gen))


def test_every_estimator_is_registered_and_importable():
    assert set(ESTIMATORS) | {"grpo@verl", "grpo@trl", "grpo@flow_grpo"} <= set(adv.available())
    for name in ESTIMATORS:
        assert getattr(adv, name) is adv.resolve(name)[0]


def test_presets_differ_exactly_where_the_peers_differ():
    r, m, g = column([1, 2, 3, 4, 7]), torch.ones(5, 1, dtype=torch.bool), torch.tensor([0, 0, 0, 0, 1])
    verl = adv.compute("grpo@verl", r, m, g)[:, 0]
    trl = adv.compute("grpo@trl", r, m, g)[:, 0]
    fg = adv.compute("grpo@flow_grpo", r, m, g)[:, 0]
    # unbiased std of [1,2,3,4] = 1.2910; verl: (1 - 2.5) / (1.2910 + 1e-6); TRL: + 1e-4
    assert verl[0].item() == pytest.approx(-1.5 / (1.2909944 + 1e-6), abs=1e-6)
    assert trl[0].item() == pytest.approx(-1.5 / (1.2909944 + 1e-4), abs=1e-6)
    # the singleton: verl's mean 0 and std 1 give 7 / (1 + 1e-6); TRL and flow_grpo give 0
    assert verl[4].item() == pytest.approx(7 / (1 + 1e-6), abs=1e-6) and trl[4] == 0 and fg[4] == 0
    # flow_grpo: population std of all five scores (mean 3.4, std 2.0591), clip 5
    assert fg[0].item() == pytest.approx((1 - 2.5) / (2.0591260 + 1e-4), abs=1e-5)
    # one success in 30: p = 1/30, (1 - p) / (sqrt(p (1 - p)) + 1e-4) = 5.38, clipped to 5
    rare = adv.compute("grpo@flow_grpo", column([0] * 29 + [1]), torch.ones(30, 1, dtype=torch.bool),
                       torch.zeros(30).long())
    assert rare[29].item() == 5.0 and rare[0].item() == pytest.approx(-(1 / 30) / (0.1795055 + 1e-4), abs=1e-5)
    assert adv.resolve("grpo@trl", eps=0.5)[1] == dict(eps=0.5, ddof=1, std_scope="group", singleton="zero",
                                                      clip=None)


def test_resolve_rejects_unknown_options_listing_the_accepted_ones():
    with pytest.raises(ValueError, match=r"grpo has no option 'gama'; its options are \['clip', 'ddof', 'eps', "
                                         r"'singleton', 'std_scope'\]"):
        adv.resolve("grpo", gama=0.9)
    with pytest.raises(ValueError, match="ddof=2 must be 0 .* std_scope='row' must be one of"):
        adv.resolve("grpo@verl", ddof=2, std_scope="row")
    with pytest.raises(ValueError, match="unknown advantage estimator 'grp'"):
        adv.resolve("grp")
    with pytest.raises(ValueError, match="gae has no option 'singleton'"):  # the plain functions check too
        adv.gae(column([1]), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1).long(), values=column([0]),
                singleton="raw")


def test_missing_or_malformed_inputs_are_named():
    r, m, g = column([1, 2]), torch.ones(2, 1, dtype=torch.bool), torch.zeros(2).long()
    with pytest.raises(ValueError, match="'remax' needs baselines .* pass baselines="):
        adv.compute("remax", r, m, g)
    with pytest.raises(ValueError, match=r"baselines must have shape \(2,\)"):
        adv.compute("remax", r, m, g, baselines=torch.zeros(3))
    with pytest.raises(ValueError, match="step_group_ids must be an integer"):
        adv.compute("gigpo", r, m, g, step_group_ids=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="NaN or inf"):
        adv.compute("grpo", column([1, float("nan")]), m, g)
    with pytest.raises(ValueError, match="group_ids must be an integer"):
        adv.compute("grpo", r, m, torch.zeros(2))


def test_compute_ignores_inputs_the_estimator_does_not_read():
    gen = torch.Generator().manual_seed(1)
    r, m, g = torch.randn(6, 3, generator=gen), torch.ones(6, 3, dtype=torch.bool), torch.arange(6) // 3
    assert torch.equal(adv.compute("grpo", r, m, g, **inputs(6, 3)), adv.compute("grpo", r, m, g))
    assert torch.equal(adv.grpo(r, m, g, **inputs(6, 3)), adv.grpo(r, m, g))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_clips_and_zeroes_masked_positions(name):
    gen = torch.Generator().manual_seed(2)
    r, g = 10 * torch.randn(8, 4, generator=gen), torch.arange(8) // 4
    m = torch.rand(8, 4, generator=gen) > 0.3
    m[:, 0] = True
    r[~m] = float("nan")  # nothing at a masked position may leak into the result
    out = adv.compute(name, r, m, g, clip=0.5, **inputs(8, 4))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out[~m] == 0).all() and out.abs().max() <= 0.5
    assert adv.compute(name, r.double(), m, g, **inputs(8, 4)).dtype == torch.float64


def test_register_refuses_duplicates_and_preset_names():
    with pytest.raises(ValueError, match="already registered"):
        adv.register("grpo")(lambda rewards, mask, group_ids: rewards)
    with pytest.raises(ValueError, match="reserved for presets"):
        adv.register("grpo@mine")


def test_grpo_loop_checks_the_estimator_before_loading():
    from flowrl.methods import FlowGRPO
    from tests.methods.options import option_problems

    problems = option_problems(FlowGRPO, advantage="rloo@trl", advantage_options={"eps": 1e-4})
    assert any("rloo@trl has no option 'eps'; its options are ['clip', 'singleton']" in p for p in problems)
