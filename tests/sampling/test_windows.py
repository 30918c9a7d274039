"""MixGRPO's sliding SDE window, held to Tencent-Hunyuan/MixGRPO fastvideo/utils/grpo_states.py
(GRPOTrainingStates.update_iteration, get_current_timesteps) as train_grpo_flux.py drives it: max_timesteps =
sampling_steps - 2, the window read before update_iteration, the published script's settings (25 steps, window 4,
iters_per_group 25, prog_overlap_step 1, roll_back)."""

import numpy as np
import pytest

from flowrl.sampling.windows import progressive_start, random_start, window_steps


def authors_progressive(iterations, *, iters_per_group, max_timesteps, step, roll_back, start=0):
    """The state machine of GRPOTrainingStates.update_iteration ("progressive", prog_overlap) stepped one
    iteration at a time, as the training loop reads it (cur_timestep before the update)."""
    cur, in_group, seen = start, 0, []
    for _ in range(iterations):
        seen.append(cur)
        in_group += 1
        if in_group >= iters_per_group:
            in_group = 0
            cur += step
        if cur > max_timesteps:
            cur, in_group = (start, 0) if roll_back else (max_timesteps, in_group)
    return seen


@pytest.mark.parametrize("roll_back", [True, False])
@pytest.mark.parametrize("every,stride,start", [(25, 1, 0), (3, 2, 1), (1, 4, 0)])
def test_progressive_matches_the_authors_state_machine(roll_back, every, stride, start):
    T = 25
    expected = authors_progressive(700, iters_per_group=every, max_timesteps=T - 2, step=stride,
                                   roll_back=roll_back, start=start)
    got = [progressive_start(i, start=start, every=every, last=T - 2, stride=stride, roll_back=roll_back)
           for i in range(700)]
    assert got == expected


def test_published_schedule_windows_by_hand():
    # 25 steps, window 4, every 25 iterations: iterations 0-24 train [0, 4), 25-49 [1, 5), ...; w = 21 (iteration
    # 525) trains [21, 23) (clipped at T - 2 = 23), w = 23 (iteration 575) trains nothing, iteration 600 rolls back
    T, S = 25, 4
    start = lambda i: progressive_start(i, start=0, every=25, last=T - 2)  # noqa: E731
    assert window_steps(start(0), S, T - 2) == [0, 1, 2, 3]
    assert window_steps(start(24), S, T - 2) == [0, 1, 2, 3]
    assert window_steps(start(25), S, T - 2) == [1, 2, 3, 4]
    assert window_steps(start(525), S, T - 2) == [21, 22]
    assert window_steps(start(575), S, T - 2) == []
    assert window_steps(start(600), S, T - 2) == [0, 1, 2, 3]


def test_tree_rpo_schedule_is_the_progressive_one():
    # Dynamic-TreeRPO's window_at wraps inside [start, T - d]: the same function with last = T - d
    from types import SimpleNamespace

    from flowrl.methods.tree_rpo import TreeRPO
    o = SimpleNamespace(num_steps=10, window_size=4, window_start=1, window_shift_every=2)
    # span = 10 - 4 - 1 + 1 = 6 positions 1..6, two batches each
    assert [TreeRPO.window_at(o, b) for b in range(14)] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 1, 1]


def test_random_start_covers_the_range_and_repeats():
    # MixGRPO "random": rng.integers(0, max_timesteps - group_size + 1), i.e. w in [0, T - 2 - S]; T = 25, S = 4
    draws = [random_start(i, low=0, high=25 - 2 - 4, seed=42) for i in range(2000)]
    assert set(draws) == set(range(20))
    assert draws == [random_start(i, low=0, high=19, seed=42) for i in range(2000)]  # a function of (seed, i)
    assert draws != [random_start(i, low=0, high=19, seed=43) for i in range(2000)]
    assert draws[5] == int(np.random.default_rng([42, 5]).integers(0, 20))


@pytest.mark.parametrize("call", [lambda: progressive_start(-1, start=0, every=1, last=3),
                                  lambda: progressive_start(0, start=0, every=0, last=3),
                                  lambda: progressive_start(0, start=4, every=1, last=3),
                                  lambda: random_start(0, low=3, high=2, seed=0)])
def test_bad_schedules_are_refused(call):
    with pytest.raises(ValueError, match="needs"):
        call()


def test_window_mask_progressive_and_random():
    from flowrl.sampling.windows import window_mask
    # T = 25, S = 4, every 25: the published schedule, the empty window at w = 23 skipped
    masks = [window_mask(i, num_steps=25, size=4, every=25) for i in range(0, 600, 25)]
    assert [m.nonzero().flatten().tolist() for m in masks[:2]] == [[0, 1, 2, 3], [1, 2, 3, 4]]
    assert masks[22].nonzero().flatten().tolist() == [22] and masks[23].nonzero().flatten().tolist() == [0, 1, 2, 3]
    for i in range(50):
        m = window_mask(i, num_steps=10, size=2, strategy="random", low=0, high=5, seed=42)
        steps = m.nonzero().flatten().tolist()
        assert len(steps) == 2 and steps[1] == steps[0] + 1 and steps[1] < 5  # verl-omni: window 2 in [0, 5)
    with pytest.raises(ValueError, match="needs a strategy"):
        window_mask(0, num_steps=10, size=2, strategy="decay")
