"""``scripts/distill_tiny_guidance.py`` and the guidance-distilled bases it made, ``flowrl/tiny-digits-gd`` and the
quickstart's 3-block ``flowrl/tiny-digits-gd3``: one conditional pass must stand in for the teacher's CFG pair."""

import json
import sys
from pathlib import Path

import pytest
import torch

from flowrl.policies import TinyFlowPolicy
from flowrl.sampling.sampler import sample

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import distill_tiny_guidance as distill  # noqa: E402

PROMPTS = ["red 3 and blue 7", "green 0 and green 5"]


def guided_gap(student: TinyFlowPolicy, teacher: TinyFlowPolicy, steps: int = 6) -> tuple[float, float]:
    """On the teacher's guided 6-step trajectories: the mean squared gap to its guided velocity of the student's
    conditional velocity, and of the teacher's own conditional velocity (what sampling without CFG would use)."""
    sigmas, cond, guided = teacher.sigmas(steps), teacher.encode(PROMPTS), []
    with torch.no_grad():
        latents, _ = sample(lambda z, s, rows: teacher.velocity(z, s, cond, 4.5), torch.tensor([5, 6]), sigmas,
                            teacher.latent_shape(), "ode", velocities=guided)
        states, target = latents[:, :-1].transpose(0, 1).flatten(0, 1), torch.cat(guided)
        t = sigmas[:-1].repeat_interleave(len(PROMPTS))
        every = PROMPTS * steps
        gap = [(p.velocity(states, t, p.encode(every), 1.0) - target).square().mean().item()
               for p in (student, teacher)]
    return gap[0], gap[1]


@pytest.mark.parametrize("base", ["tiny-digits-gd", "tiny-digits-gd3"])  # 4 blocks; 3 blocks, the quickstart's
def test_the_shipped_base_samples_without_cfg_close_to_the_teacher_with_it(base):
    teacher = TinyFlowPolicy("flowrl/tiny-digits", lora=None).load()
    student = TinyFlowPolicy(f"flowrl/{base}", lora=None).load()
    mine, unguided = guided_gap(student, teacher)
    assert mine < 0.25 * unguided, (mine, unguided)
    record = json.loads((ROOT / f"flowrl/assets/{base}/distillation.json").read_text())
    assert record["after_10"] > 2 * record["before_10"]  # without CFG: the student against the teacher
    assert student.denoiser.config.num_layers == record.get("layers", 4)


def test_a_few_iterations_close_the_gap_and_write_a_loadable_folder(tmp_path):
    out = tmp_path / "gd"
    teacher = TinyFlowPolicy("flowrl/tiny-digits", lora=None).load()
    result = distill.main(["--iterations", "6", "--batch_size", "4", "--lr", "2e-4", "--eval_seeds", "1",
                           "--val_limit", "2", "--grids", "6", "--out", str(out)])
    student = TinyFlowPolicy(str(out), lora=None).load()
    before, after = guided_gap(teacher, teacher)[0], guided_gap(student, teacher)[0]
    assert after < before, (after, before)
    assert json.loads((out / "distillation.json").read_text())["iterations"] == result["iterations"] == 6
    assert {p.name for p in out.iterdir()} >= {"tokenizer", "text_encoder", "scheduler", "transformer"}


def test_init_continues_from_an_earlier_student(tmp_path):
    small = ["--batch_size", "2", "--eval_seeds", "1", "--val_limit", "2", "--grids", "6"]
    distill.main(["--iterations", "2", "--out", str(tmp_path / "a")] + small)
    result = distill.main(["--iterations", "0", "--init", str(tmp_path / "a"), "--out", str(tmp_path / "b")] + small)
    a, b, teacher = (TinyFlowPolicy(str(path), lora=None).load().denoiser.state_dict()
                     for path in (tmp_path / "a", tmp_path / "b", "flowrl/tiny-digits"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # no iteration: the earlier student unchanged
    assert not all(torch.equal(a[k], teacher[k]) for k in a)
    assert result["init"] == str(tmp_path / "a") and result["before_6"] == result["after_6"]
    assert result["earlier"]["iterations"] == 2  # the record of the run it continued


@pytest.mark.parametrize("bad", [["--grids", "0"]])
def test_bad_grid_is_refused_before_loading(bad, tmp_path):
    with pytest.raises(SystemExit):
        distill.main(bad + ["--out", str(tmp_path / "x")])


def test_layers_makes_a_shallower_student_from_the_kept_blocks(tmp_path):
    small = ["--batch_size", "2", "--eval_seeds", "1", "--val_limit", "2", "--grids", "6", "--iterations", "0"]
    result = distill.main(["--layers", "3", "--keep", "0", "2", "3", "--out", str(tmp_path / "s")] + small)
    student = TinyFlowPolicy(str(tmp_path / "s"), lora=None).load().denoiser.state_dict()
    teacher = TinyFlowPolicy("flowrl/tiny-digits", lora=None).load().denoiser.state_dict()
    assert (result["layers"], result["keep"]) == (3, [0, 2, 3])
    moved = {"transformer_blocks.1.": "transformer_blocks.2.", "transformer_blocks.2.": "transformer_blocks.3."}
    for name, value in student.items():  # block i of the student is block keep[i] of the teacher, the rest as is
        source = next((name.replace(a, b, 1) for a, b in moved.items() if name.startswith(a)), name)
        assert torch.equal(value, teacher[source]), name
    assert len(student) < len(teacher) and not any(k.startswith("transformer_blocks.3.") for k in student)


@pytest.mark.parametrize("bad", [["--layers", "3", "--keep", "0", "1", "2"], ["--layers", "5"],
                                 ["--keep", "0", "3"], ["--layers", "2", "--init", "flowrl/tiny-digits-gd"]])
def test_a_student_depth_that_cannot_be_made_is_refused_before_loading(bad, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(TinyFlowPolicy, "load", lambda self: pytest.fail("loaded before the check"))
    with pytest.raises(SystemExit):
        distill.main(bad + ["--out", str(tmp_path / "x")])
    assert "--keep" in capsys.readouterr().err or "--init" in bad
