"""MixGRPO-Flash's compressed tail (sampling/coarse_tail.py, ``sample(grid=...)``): the authors' point count
(``Tencent-Hunyuan/MixGRPO`` ``fastvideo/utils/sampling_utils.py``, ``run_sample_step``: ``num_post_steps =
int(max((T - L) * ratio, 1))``) on a sub-grid, the window sampled bit for bit as on the full grid, the tail's
skipped states on the Euler path of its coarse steps, and the solver stepping on the coarse grid."""

import pytest
import torch

from flowrl.policies.multistep_solvers import multistep_solver
from flowrl.sampling.coarse_tail import coarse_grid, expand_to_grid, tail_indices
from flowrl.sampling.multistep import MultistepTail
from flowrl.sampling.sampler import sample

SEEDS = torch.tensor([5, 6])
WINDOW = torch.tensor([True, True, False, False, False, False])  # T = 6, the window's last step L = 1


def shifted(t, shift=3.0):
    """SD3's time shift (the authors' ``sd3_time_shift``)."""
    return shift * t / (1 + (shift - 1) * t)


def velocity(z, sigma, rows):
    """A smooth stand-in model, non-linear in z and varying with sigma."""
    return torch.tanh(z) * (1 + sigma.view(-1, *[1] * (z.dim() - 1))) - 0.3


def test_the_tail_keeps_the_authors_count_of_points_on_the_grid():
    assert tail_indices(6, 1, 0.6) == [2, 4, 6] and tail_indices(6, 1, 0.4) == [2, 6]
    assert tail_indices(6, 1, 1.0) == [2, 3, 4, 5, 6]
    assert tail_indices(10, 2, 0.7) == [3, 5, 7, 8, 10]  # 5 points: 3 + round(j x 7 / 4) = 3 + (0, 2, 4, 5, 7)
    assert tail_indices(6, 0, 0.5) == [1, 4, 6]  # 3 points: 1 + round(j x 5 / 2), 2.5 rounded up
    for T, L, ratio in [(25, 3, 0.4), (25, 0, 0.2), (16, 5, 0.5), (10, 2, 0.7)]:  # the authors' count, >= 2 points
        assert len(tail_indices(T, L, ratio)) == int(max((T - L) * ratio, 1))
    assert tail_indices(6, 1, 0.2) == [2, 6]  # theirs is 1 point (no step, ending off 0): flowrl takes one step
    assert tail_indices(6, 5, 0.4) == [6]  # a window on the last step leaves no tail
    # the authors' points: linspace in time from the time after the window to 0, shifted; the sub-grid's where the
    # spacing is whole (T = 6, L = 1, 3 points: every second index)
    sigmas = shifted(torch.linspace(1, 0, 7, dtype=torch.float64))
    theirs = shifted(torch.linspace(torch.linspace(1, 0, 7, dtype=torch.float64)[2].item(), 0, 3,
                                    dtype=torch.float64))
    torch.testing.assert_close(sigmas[tail_indices(6, 1, 0.6)], theirs)
    with pytest.raises(ValueError, match="0 < ratio <= 1"):
        tail_indices(6, 1, 0.0)


def test_the_grid_keeps_every_point_up_to_the_window_end():
    assert coarse_grid(WINDOW, 0.6).tolist() == [0, 1, 2, 4, 6]
    assert coarse_grid(torch.tensor([[False, True, False, False], [True, False, False, False]]), 0.5).tolist() == [
        0, 1, 2, 4]  # per row: after every row's window (the last at step 1)
    assert coarse_grid(WINDOW, 1.0) is None and coarse_grid(torch.zeros(6, dtype=torch.bool), 0.4) is None


def test_a_skipped_state_is_on_the_coarse_steps_euler_path():
    # a velocity constant in z and sigma: the full and the coarse Euler paths are one straight line
    sigmas = shifted(torch.linspace(1, 0, 7))
    constant = lambda z, sigma, rows: torch.full_like(z, 0.5) + rows.view(-1, 1, 1, 1)  # noqa: E731
    full, _ = sample(constant, SEEDS, sigmas, (2, 4, 4), "flow_grpo", 0.7, WINDOW)
    coarse, _ = sample(constant, SEEDS, sigmas, (2, 4, 4), "flow_grpo", 0.7, WINDOW, grid=coarse_grid(WINDOW, 0.4))
    torch.testing.assert_close(coarse, full, rtol=1e-5, atol=1e-6)
    # by hand: between states at sigma 1 and 0, the one at sigma 0.75 is a quarter of the way
    z, log_probs = expand_to_grid(torch.tensor([[[1.0], [-3.0]]]), torch.tensor([[2.0]]),
                                  torch.tensor([1.0, 0.75, 0.5, 0.0]), torch.tensor([0, 3]))
    assert z.flatten().tolist() == [1.0, 0.0, -1.0, -3.0] and log_probs.tolist() == [[2.0, 0.0, 0.0]]


@pytest.mark.parametrize("shape", [(2, 4, 4), (3,)])  # 32 values: drawn step by step; 3: drawn all at once
def test_the_window_is_the_full_grids_and_the_tail_is_euler_on_the_sub_grid(shape):
    sigmas, grid = shifted(torch.linspace(1, 0, 7)), coarse_grid(WINDOW, 0.6)
    full, full_log_probs = sample(velocity, SEEDS, sigmas, shape, "flow_grpo", 0.7, WINDOW)
    calls = []
    counted = lambda z, sigma, rows: calls.append(sigma[0].item()) or velocity(z, sigma, rows)  # noqa: E731
    latents, log_probs = sample(counted, SEEDS, sigmas, shape, "flow_grpo", 0.7, WINDOW, grid=grid)
    assert latents.shape == full.shape and torch.equal(latents[:, :3], full[:, :3])  # noise, the window's 2 steps
    assert torch.equal(log_probs, full_log_probs) and log_probs[:, :2].ne(0).all()
    assert calls == sigmas[[0, 1, 2, 4]].tolist()  # the model at the coarse grid's points only
    rows = torch.arange(2)
    z4 = latents[:, 2] + (sigmas[4] - sigmas[2]) * velocity(latents[:, 2], sigmas[2].expand(2), rows)
    z6 = z4 + (sigmas[6] - sigmas[4]) * velocity(z4, sigmas[4].expand(2), rows)
    torch.testing.assert_close(latents[:, 4], z4, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(latents[:, 6], z6, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(latents[:, 6], full[:, 6], atol=1e-4)  # a coarser integration, not the full one


def test_the_solver_steps_on_the_coarse_grid():
    sigmas, grid = shifted(torch.linspace(1, 0, 7)), coarse_grid(WINDOW, 0.6)
    coarse = sigmas[grid]
    latents, _ = sample(velocity, SEEDS, sigmas, (2, 4, 4), "flow_grpo", 0.7, WINDOW, grid=grid,
                        tail=MultistepTail(multistep_solver("dpmsolver++"), coarse, 2))
    # diffusers' solver on the coarse grid, fed the window's model outputs, solving from coarse step 2 on
    scheduler = multistep_solver("dpmsolver++")
    scheduler.set_timesteps(4)
    scheduler.sigmas, z = coarse.clone(), latents[:, 0]
    scheduler.set_begin_index(0)
    for k in range(4):
        v = velocity(z, coarse[k].expand(2), torch.arange(2))
        solved = scheduler.step(v, scheduler.timesteps[k], z, return_dict=False)[0]
        z = latents[:, grid[k + 1]] if k < 2 else solved
        if k == 2:
            torch.testing.assert_close(latents[:, 4], solved, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(latents[:, 6], z, rtol=1e-5, atol=1e-6)
    euler, _ = sample(velocity, SEEDS, sigmas, (2, 4, 4), "flow_grpo", 0.7, WINDOW, grid=grid)
    assert not torch.allclose(latents[:, 6], euler[:, 6], atol=1e-4)  # the solver's second-order step, not Euler


def test_a_grid_that_merges_a_stochastic_step_is_refused():
    sigmas = torch.linspace(1, 0, 7)
    with pytest.raises(ValueError, match="merges the stochastic steps \\[0, 1\\]"):
        sample(velocity, SEEDS, sigmas, (3,), "flow_grpo", 0.7, WINDOW, grid=torch.tensor([0, 2, 4, 6]))
    with pytest.raises(ValueError, match="must rise from 0 to T = 6"):
        sample(velocity, SEEDS, sigmas, (3,), "flow_grpo", 0.7, WINDOW, grid=torch.tensor([0, 1, 2, 4]))
