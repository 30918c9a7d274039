"""Guidance scales are refused where they mean something other than what the family's diffusers pipeline means by
them (issue 38): below 1 for every family that guides, other than 1 for a step-distilled model, with the reason."""

import pytest

from flowrl.methods.option_surface import guidance_distillation_problems, guidance_scale_problems
from flowrl.policies import TinyFlowPolicy, ZImagePolicy

TINY = TinyFlowPolicy()  # built from its configs: no weight loads


@pytest.mark.parametrize("scale", [0.0, -1.0, 0.5])
def test_below_one_is_refused_with_the_reason(scale):
    problem, = guidance_scale_problems(TINY, scale)
    assert problem.startswith(f"model.guidance_scale={scale}: below 1, classifier-free guidance v_u + w (v_c - v_u) "
                              "moves away from the prompt")
    assert "1 disables guidance" in problem and "use 1.0 (no guidance) or above" in problem


@pytest.mark.parametrize("scale", [1.0, 1.5, 4.5])
def test_one_and_above_pass(scale):
    assert guidance_scale_problems(TINY, scale) == []


def test_z_image_names_its_pipelines_offset():
    # ZImagePipeline guides with pos + g (pos - neg), on above 0: flowrl's w = g + 1, so w < 1 is its g < 0
    z_image = object.__new__(ZImagePolicy)  # the family's class and guidance kind are all the check reads
    problem, = guidance_scale_problems(z_image, 0.0)
    assert "ZImagePipeline's guidance_scale is this minus 1 (its 0, no guidance, is 1 here)" in problem
    assert guidance_scale_problems(z_image, 1.0) == []


def test_tdm_r1s_teacher_and_surrogate_guidance_too():
    problems = guidance_distillation_problems(TINY, 0.0, -2.0)
    assert [p.split(":")[0] for p in problems] == ["model.teacher_guidance=0.0", "model.surrogate_guidance=-2.0"]


def test_wan_2_2s_second_expert_scale(tiny_model_dir):
    from flowrl.methods import FlowGRPO
    from tests.methods.options import option_problems

    policy = TinyFlowPolicy(tiny_model_dir)
    policy.guidance_scale_2 = 0.0  # as a Wan 2.2 policy holds its second expert's scale
    problems = option_problems(FlowGRPO, policy=policy)
    assert any(p.startswith("model.init_args.policy.init_args.guidance_scale_2=0.0: below 1") for p in problems)


@pytest.mark.parametrize("first, second, refused", [(1.0, 3.0, True), (4.0, 3.0, False), (1.0, 1.0, False)])
def test_the_wan_pipelines_gate_a_second_scale_under_a_first_of_one(tiny_model_dir, first, second, refused):
    # WanPipeline guides only when guidance_scale > 1: at 1 it runs no CFG at all, guidance_scale_2 ignored
    from flowrl.methods import FlowGRPO
    from tests.methods.options import option_problems

    policy = TinyFlowPolicy(tiny_model_dir)
    policy.guidance_scale_2 = second  # as a Wan 2.2 policy holds its second expert's scale
    gate = [p for p in option_problems(FlowGRPO, policy=policy, guidance_scale=first) if "WanPipeline" in p]
    assert bool(gate) == refused, gate
    if refused:
        assert gate[0].startswith(f"model.guidance_scale={first} with model.init_args.policy.init_args."
                                  f"guidance_scale_2={second}: WanPipeline runs no guidance at all")
