"""The optimizer steps of named adapters (TDM-R1, DiffusionNFT) and DeepSpeed's checked step, as components: bare
parameters, ``plain_steps`` or a hand-made ``TrainingSteps`` whose collective is written out, a fake engine; no
LightningModule. Expected values are computed by hand next to each assertion."""

import dataclasses
import math
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from flowrl.strategies.deepspeed import accumulating, deepspeed_engine, deepspeed_step
from flowrl.training import plain_steps
from flowrl.training.adapter_steps import adapter_step, backward, reduce_gradients


def two_adapters():
    """Two 'adapters' ``a`` and ``b`` and a loss ``sum(a^2) + 3 sum(a b)`` with gradients ``2a + 3b`` and ``3a``."""
    a, b = nn.Parameter(torch.tensor([1.0, -2.0])), nn.Parameter(torch.tensor([0.5, 4.0]))
    return a, b, (a ** 2).sum() + 3 * (a * b).sum()


def test_an_adapter_step_moves_only_its_adapter_by_sgd():
    a, b, loss = two_adapters()
    steps = plain_steps([a, b])
    backward(steps, loss)  # both adapters get their gradients
    norm = adapter_step(steps, torch.optim.SGD([a], lr=0.1), [a], loss_finite=True)
    grad_a = torch.tensor([2 * 1.0 + 3 * 0.5, 2 * -2.0 + 3 * 4.0])  # 2a + 3b = [3.5, 8]
    assert norm == pytest.approx(grad_a.norm().item())  # sqrt(3.5^2 + 8^2)
    torch.testing.assert_close(a.detach(), torch.tensor([1.0, -2.0]) - 0.1 * grad_a)
    assert torch.equal(b.detach(), torch.tensor([0.5, 4.0]))  # the other adapter waits for its own step
    torch.testing.assert_close(b.grad, torch.tensor([3.0, -6.0]))  # 3a, still there for it
    assert a.grad is None  # zeroed after the step


def test_an_adapter_step_is_clipped_and_a_non_finite_one_skipped():
    a, b, loss = two_adapters()
    steps = plain_steps([a, b], max_grad_norm=1.0)
    backward(steps, loss)
    optimizer = torch.optim.SGD([a], lr=0.1)
    assert adapter_step(steps, optimizer, [a], loss_finite=False) is None  # skipped: the weights stay
    assert torch.equal(a.detach(), torch.tensor([1.0, -2.0])) and a.grad is None
    a.grad = torch.tensor([3.0, 4.0])  # norm 5, clipped to 1: the step is 0.1 * [0.6, 0.8]
    assert adapter_step(steps, optimizer, [a], loss_finite=True) == pytest.approx(5.0)
    torch.testing.assert_close(a.detach(), torch.tensor([1.0 - 0.06, -2.0 - 0.08]), rtol=1e-5, atol=1e-6)


def test_an_uncounted_step_says_so_to_the_training_loop():
    a, _, loss = two_adapters()
    calls = []
    steps = plain_steps([a])
    step = steps.optimizer_step
    steps = dataclasses.replace(steps, optimizer_step=lambda opt, finite, params, counted: (
        calls.append(counted), step(opt, finite, params, counted))[1])
    backward(steps, loss)
    adapter_step(steps, torch.optim.SGD([a], lr=0.1), [a], True, counted=False)
    assert calls == [False]  # the auxiliary adapter's step must not count as a global step


def ranks_of_two(other_rank: torch.Tensor, sharded: bool = False):
    """A ``TrainingSteps`` of 2 ranks whose all-reduce averages this rank's flat gradient with ``other_rank``'s."""
    return dataclasses.replace(plain_steps([]), world_size=2, sharded_gradients=sharded,
                               reduce_mean=lambda flat: (flat + other_rank) / 2)


def test_reduce_gradients_averages_over_ranks_a_missing_gradient_counting_as_zero():
    p, q = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([2.0, 4.0])  # q has no gradient on this rank
    other = torch.tensor([0.0, 2.0, 6.0, 8.0, 10.0])  # the other rank's [p | q]
    reduce_gradients(ranks_of_two(other), [p, q])
    torch.testing.assert_close(p.grad, torch.tensor([1.0, 3.0]))  # (2 + 0) / 2, (4 + 2) / 2
    torch.testing.assert_close(q.grad, torch.tensor([3.0, 4.0, 5.0]))  # (0 + 6) / 2, ...
    p.grad = torch.tensor([2.0, 4.0])
    reduce_gradients(ranks_of_two(other, sharded=True), [p])  # FSDP2: the backward reduced them already
    reduce_gradients(plain_steps([p]), [p])  # one process: nothing to average
    assert torch.equal(p.grad, torch.tensor([2.0, 4.0]))


def test_backward_defers_the_gradient_sync_except_under_fsdp2():
    entered = []

    @contextmanager
    def no_sync():
        entered.append(True)
        yield

    a, _, loss = two_adapters()
    backward(dataclasses.replace(plain_steps([a]), no_sync=no_sync), loss)
    assert entered == [True] and a.grad is not None
    a2, _, loss2 = two_adapters()
    backward(dataclasses.replace(plain_steps([a2]), no_sync=no_sync, sharded_gradients=True), loss2)
    assert entered == [True]  # FSDP2 reduce-scatters inside the backward itself


class FakeEngine:
    """What the loop reads of a ``DeepSpeedEngine``: the accumulation boundary and the last step's gradient norm."""

    def __init__(self, norm):
        self.norm, self.boundaries = norm, []

    def set_gradient_accumulation_boundary(self, value: bool) -> None:
        self.boundaries.append(value)

    def get_global_grad_norm(self):
        return self.norm


def test_deepspeed_step_steps_the_engines_optimizer_and_reports_its_norm():
    p = nn.Parameter(torch.tensor([1.0, 2.0]))
    p.grad = torch.tensor([0.5, -1.0])
    judged = []
    skip = lambda finite, norm: judged.append((finite, norm)) or not finite  # noqa: E731
    norm = deepspeed_step(FakeEngine(torch.tensor(1.25)), torch.optim.SGD([p], lr=2.0), skip, True)
    assert norm == 1.25 and judged == [(True, 0.0)]  # the norm is known only after the step: the loss is judged
    torch.testing.assert_close(p.detach(), torch.tensor([0.0, 4.0]))  # 1 - 2 * 0.5, 2 + 2 * 1
    assert p.grad is None
    assert math.isnan(deepspeed_step(FakeEngine(None), torch.optim.SGD([p], lr=2.0), skip, True))  # no norm: NaN


def test_deepspeed_skips_a_non_finite_step_and_marks_micro_batches_as_accumulating():
    p = nn.Parameter(torch.tensor([1.0]))
    p.grad = torch.tensor([3.0])
    assert deepspeed_step(FakeEngine(2.0), torch.optim.SGD([p], lr=1.0), lambda finite, _: not finite, False) is None
    assert torch.equal(p.detach(), torch.tensor([1.0])) and p.grad is None
    engine = FakeEngine(0.0)
    with accumulating(engine):
        assert engine.boundaries == [False]  # backward passes in here add up
    assert engine.boundaries == [False, True]

    class Trainer:
        model = engine

    assert deepspeed_engine(Trainer()) is engine
    Trainer.model = nn.Linear(1, 1)  # any other strategy's model
    assert deepspeed_engine(Trainer()) is None
