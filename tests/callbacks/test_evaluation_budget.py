"""EvaluationBudget stops a fit at the batch whose model evaluations reach the budget, and resumes its count."""

import pytest

from flowrl.callbacks import EvaluationBudget
from flowrl.cli import main
from tests.cli.test_fit import fit_args, load_steps


def test_the_fit_stops_at_the_batch_that_spends_the_budget(tiny_model_dir, tmp_path):
    # fit_tiny: 8 trajectories x 3 steps = 24 evaluations per batch; 50 are reached by the third batch
    main(fit_args(tiny_model_dir, tmp_path, "--trainer.max_steps=100",
                  "--trainer.callbacks+=flowrl.callbacks.EvaluationBudget", "--trainer.callbacks.max_evaluations=50"))
    assert sorted(load_steps(tmp_path)) == ["step0_rank0", "step1_rank0", "step2_rank0"]


def test_the_count_is_checkpointed_and_bad_budgets_are_refused():
    budget = EvaluationBudget(100)
    budget.spent = 72.0
    again = EvaluationBudget(100)
    again.load_state_dict(budget.state_dict())
    assert again.spent == 72.0
    with pytest.raises(ValueError, match="max_evaluations=0 must be > 0"):
        EvaluationBudget(0)
