"""ODE completion: batched completions of every start step equal a serial loop and a plain Euler ODE, per-sample
sigma grids, NFE counts, and chunked scoring of completions."""

import pytest
import torch

from flowrl.policies import LoraOptions, TinyFlowPolicy
from flowrl.sampling.completion_rewards import completion_rewards
from flowrl.sampling.ode_complete import complete_trajectories, completion_sigmas, ode_complete
from flowrl.sampling.sampler import sample
from flowrl.sampling.steps import ode_step


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TinyFlowPolicy(tiny_model_dir, lora=LoraOptions(rank=4, alpha=4)).load()


def counting(velocity):
    """The velocity, counting the rows it evaluates (a CFG pair is one row) and its calls."""
    count = {"rows": 0, "calls": 0}

    def wrapped(*args):
        count["rows"] += args[0].shape[0]
        count["calls"] += 1
        return velocity(*args)

    return wrapped, count


def euler(velocity, z, sigmas):
    """A plain Euler ODE along ``sigmas`` (the reference the batched completion must match)."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        z = ode_step(z, velocity(z, sigma.expand(z.shape[0])), sigma, sigma_next).z_next
    return z


@pytest.fixture(scope="module")
def trajectories(policy):
    prompts = ["red 3 and blue 7", "green 1 and red 2", "blue 5 and green 6"]
    cond = policy.encode(prompts)
    sigmas = policy.sigmas(6)
    with torch.no_grad():
        latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond, 3.0), torch.tensor([1, 2, 3]), sigmas,
                            policy.latent_shape(), "flow_grpo", 0.7)
    row_velocity = lambda z, s, rows: policy.velocity(z, s, cond.select(rows), 3.0)  # noqa: E731
    return prompts, cond, sigmas, latents, row_velocity


def test_batched_completions_equal_a_serial_loop_and_a_plain_euler_ode(policy, trajectories):
    prompts, cond, sigmas, latents, row_velocity = trajectories
    batch, num_steps = latents.shape[0], sigmas.numel() - 1
    velocity, count = counting(row_velocity)
    out = complete_trajectories(velocity, latents, sigmas)
    assert out.latents.shape == (batch, num_steps, *policy.latent_shape())
    # every pair advances together: T sequential calls, not T (T + 1) / 2
    assert count["calls"] == num_steps and count["rows"] == batch * num_steps * (num_steps + 1) // 2
    assert out.nfe.tolist() == [[6, 5, 4, 3, 2, 1]] * batch
    rows = torch.arange(batch)
    with torch.no_grad():
        for k in range(num_steps):
            serial = ode_complete(row_velocity, latents[:, k], rows, torch.full((batch,), k), sigmas)
            assert torch.allclose(out.latents[:, k], serial.latents, atol=1e-5)
            for b in range(batch):
                one = lambda z, s, rows=None: policy.velocity(z, s, cond.select([b]), 3.0)  # noqa: E731
                plain = euler(one, latents[b:b + 1, k], sigmas[k:])
                assert torch.allclose(out.latents[b, k], plain[0], atol=1e-5)


def test_rows_pick_each_pairs_conditioning_and_chunks_do_not_change_results(trajectories):
    _, _, sigmas, latents, row_velocity = trajectories
    # pairs listed in a scrambled order, with per-pair rows and starts, in chunks of 4 rows per call
    rows, start = torch.tensor([2, 0, 1, 2, 0]), torch.tensor([1, 4, 0, 5, 2])
    velocity, count = counting(row_velocity)
    out = ode_complete(velocity, latents[rows, start], rows, start, sigmas, chunk_size=4)
    assert count["rows"] == int(out.nfe.sum()) == 5 + 2 + 6 + 1 + 4
    full = complete_trajectories(row_velocity, latents, sigmas)
    assert torch.allclose(out.latents, full.latents[rows, start], atol=1e-5)


def test_completion_from_the_end_is_the_state_itself_and_costs_nothing(trajectories):
    _, _, sigmas, latents, row_velocity = trajectories
    out = ode_complete(row_velocity, latents[:, -1], torch.arange(3), torch.full((3,), 6), sigmas)
    assert torch.equal(out.latents, latents[:, -1]) and out.nfe.tolist() == [0, 0, 0]


def test_completion_steps_take_n_euler_steps_on_the_interpolated_schedule(trajectories):
    _, _, sigmas, latents, row_velocity = trajectories
    # T=6, n=2: start 0 -> indices 0, 3, 6; start 4 -> 4, 5, 6 (the remaining schedule); start 5 -> one step
    grid, steps = completion_sigmas(sigmas, torch.tensor([0, 4, 5]), 2)
    assert steps.tolist() == [2, 2, 1]
    assert torch.allclose(grid, torch.stack([sigmas[[0, 3, 6]], sigmas[[4, 5, 6]], sigmas[[5, 6, 6]] * torch.tensor(
        [1.0, 1.0, 0.0])]))
    # T=6, n=4 from start 0: indices 0, 1.5, 3, 4.5, 6 (linear between schedule points)
    grid, _ = completion_sigmas(sigmas, torch.tensor([0]), 4)
    assert grid[0, 1].item() == pytest.approx(((sigmas[1] + sigmas[2]) / 2).item())
    out = complete_trajectories(row_velocity, latents, sigmas, completion_steps=2)
    assert out.nfe[0].tolist() == [2, 2, 2, 2, 2, 1]
    one = lambda z, s, rows=None: row_velocity(z, s, torch.zeros(1, dtype=torch.long))  # noqa: E731
    plain = euler(one, latents[:1, 0], sigmas[[0, 3, 6]])
    assert torch.allclose(out.latents[0, 0], plain[0], atol=1e-5)


def test_bad_inputs_name_the_problem(trajectories):
    _, _, sigmas, latents, row_velocity = trajectories
    with pytest.raises(ValueError, match=r"start indices must lie in \[0, 6\]"):
        ode_complete(row_velocity, latents[:1, 0], torch.tensor([0]), torch.tensor([7]), sigmas)
    with pytest.raises(ValueError, match="completion_steps=0 must be >= 1"):
        ode_complete(row_velocity, latents[:1, 0], torch.tensor([0]), torch.tensor([0]), sigmas, 0)
    with pytest.raises(ValueError, match="one entry per state"):
        ode_complete(row_velocity, latents[:2, 0], torch.tensor([0]), torch.tensor([0]), sigmas)


def test_completion_rewards_score_every_image_once_in_chunks():
    latents = torch.randn(3, 4, 1, 2, 2)
    calls, decoded = [], []

    def score(images, prompts, rows):
        calls.append(rows.tolist())
        return images.flatten(1).sum(1) + torch.tensor([float(p) for p in prompts])

    def decode(z, rows):  # the decode is told the rows too (LTX-2 image-to-video decodes with each row's first frame)
        decoded.append(rows.tolist())
        return z * 2

    rewards = completion_rewards(decode, latents, ["10", "20", "30"], score, chunk_size=5)
    # 12 images, at most 5 per decode + score call, each told the trajectory it completes
    assert calls == decoded == [[0, 0, 0, 0, 1], [1, 1, 1, 2, 2], [2, 2]]
    expected = 2 * latents.flatten(2).sum(2) + torch.tensor([[10.0], [20.0], [30.0]])
    assert torch.allclose(rewards, expected)
    with pytest.raises(ValueError, match="one prompt per trajectory"):
        completion_rewards(lambda z, rows: z, latents, ["a"], score)
