"""FunctionReward: callables by dotted path, option pass-through, clear errors (also for results that are not
numbers, from any reward), and a 2-step ``fit`` with a function reward and JPEG compressibility whose logged
per-reward means and weighted total agree."""

import csv
import re
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from flowrl.rewards import FunctionReward, RewardCallback

HERE = Path(__file__).resolve().parent
FIT_TINY = str(HERE.parent / "cli" / "fit_tiny.yaml")
FUNCTIONS = "tests.rewards.reward_functions"


def test_function_results_of_every_kind_become_float_scores():
    images = torch.linspace(0, 1, 4 * 3 * 2 * 2).reshape(4, 3, 2, 2)
    reward = FunctionReward(f"{FUNCTIONS}.brightness", options={"gamma": 2.0, "offset": 1.0}, batch_size=3)
    expected = images.pow(2).mean(dim=(1, 2, 3)) + 1.0  # gamma and offset reached the function
    torch.testing.assert_close(reward.score(images, ["p"] * 4), expected)
    assert reward.name == "brightness" and reward.score(images, ["p"] * 4).dtype == torch.float32
    lengths = FunctionReward(f"{FUNCTIONS}.prompt_lengths", name="length").score(images[:2], ["ab", "abcde"])
    assert lengths.tolist() == [2.0, 5.0]


def test_bad_paths_options_and_results_fail_clearly(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="dotted path"):
        FunctionReward("brightness")
    with pytest.raises(ImportError, match="no module of that path can be imported"):
        FunctionReward("no_such_package.rewards.score")
    with pytest.raises(ImportError, match="has no callable 'brightnes'"):
        FunctionReward(f"{FUNCTIONS}.brightnes")
    with pytest.raises(ValueError, match="gamma_typo"):
        FunctionReward(f"{FUNCTIONS}.brightness", options={"gamma_typo": 2.0})
    (tmp_path / "needs_missing_dep.py").write_text("import not_installed_dependency\n\ndef score(i, p, m):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="not_installed_dependency"):
        FunctionReward("needs_missing_dep.score")
    short = FunctionReward(f"{FUNCTIONS}.one_score_short")
    with pytest.raises(ValueError, match=r"returned shape \(2,\) for 3 images"):
        short.score(torch.rand(3, 3, 2, 2), ["a", "b", "c"])


def test_fit_logs_each_reward_and_the_weighted_total(tiny_model_dir, tmp_path):
    main(["fit", "--config", FIT_TINY, "--config", str(HERE / "fit_function_reward.yaml"),
          f"--model.init_args.policy.init_args.model={tiny_model_dir}", f"--trainer.default_root_dir={tmp_path}",
          f"--trainer.logger.init_args.save_dir={tmp_path}"])
    (metrics,) = tmp_path.glob("fit_function_reward/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/reward/total")]
    assert len(rows) == 2  # max_steps: 2, a row per step
    for row in rows:
        bright, jpeg = float(row["train/reward/brightness"]), float(row["train/reward/jpeg_compressibility"])
        total = float(row["train/reward/total"])
        assert 100.0 <= bright <= 101.0  # mean(pixel ** 2) + offset 100: the YAML's options arrived
        assert jpeg < 0  # compressibility is minus the JPEG size in kB
        # weights 0.25 and 2.0 from the YAML; the mean of the weighted sum is the weighted sum of the means
        assert total == pytest.approx(0.25 * bright + 2.0 * jpeg, rel=1e-5)


def returns_option(images, prompts, metadata, value=None):
    """Returns ``value`` whatever it is scoring (named by dotted path below)."""
    return value


@pytest.mark.parametrize("value, described", [
    ("high", "returned a str ('high')"),
    (["high", "low", "mid"], "returned a list of str (['high', 'low', 'mid'])"),
    ([0.5, None, 1.0], "returned a list of NoneType and float ([0.5, None, 1.0])"),
    ({"score": 1.0}, "returned a dict ({'score': 1.0})"),
    (None, "returned a NoneType (None)"),
    (torch.zeros(3, dtype=torch.complex64), "returned a torch.complex64 tensor"),
    (torch.zeros(3, 1), "returned shape (3, 1) for 3 images"),
], ids=["string", "strings", "none-in-list", "dict", "none", "complex", "column"])
def test_results_that_are_not_scores_fail_naming_the_reward_and_what_it_returned(value, described):
    reward = FunctionReward(f"{__name__}.returns_option", name="words", options={"value": value})
    expected = (rf"FunctionReward 'words': {__name__}.returns_option {re.escape(described)}; it must return a tensor, "
                r"a NumPy array or a list of 3 floats \(finite, or NaN")
    with pytest.raises(ValueError, match=expected) as err:
        reward.score(torch.rand(3, 3, 2, 2), ["a", "b", "c"])
    assert type(err.value).__name__ == "RewardOutputError"  # a ValueError the reward server answers with 500


def test_any_reward_whose_score_is_not_numbers_is_named():
    class Judge(RewardCallback):
        default_name = "judge"

        def _score(self, images, prompts, metadata):
            return ["good" for _ in prompts]

    with pytest.raises(ValueError, match=r"reward 'judge' \(Judge\) returned a list of str \(\['good', 'good'\]\); "
                                         r"it must return a tensor, a NumPy array or a list of 2 floats"):
        Judge().score(torch.rand(2, 3, 2, 2), ["a", "b"])
    nan = FunctionReward(f"{__name__}.returns_option", options={"value": [float("nan"), 1]})
    assert torch.equal(nan.score(torch.rand(2, 3, 2, 2), ["a", "b"]).isnan(), torch.tensor([True, False]))
