"""GCPO / Chunk-GRPO's chunk loss and chunk draw, held to xingzhejun/GCPO @ea6cc4d fastvideo/train_grpo_flux_hpsv3.py
(train_one_step, the use_chunk branch: chunk_log_probs = mean over the chunk, ratio = exp(new - old), PPO clip
(1 - clip_range, 1 + right_clip_range), loss / train_chunks; perms by randperm or multinomial on the L1-normalised
chunk weights) and fastvideo/utils/chunk.py set_chunk."""

import pytest
import torch
import torch.nn.functional as F

from flowrl.losses import aggregate, chunk_gspo, draw_chunks, policy_loss, relative_l1_changes, resolve_policy_loss
from flowrl.losses.chunks import chunk_ids

OLD = torch.tensor([[-1.0, -1.2, -0.9, -1.1, -1.0, -1.3], [-0.8, -1.0, -1.1, -0.9, -1.2, -1.0]])
DELTA = torch.tensor([[2e-4, -1e-4, 3e-5, 6e-5, -2e-5, 1e-4], [-3e-4, 1e-4, 2e-5, -8e-5, 4e-5, 9e-5]])
ADV = torch.tensor([[1.5], [-0.7]])


def authors_loss(new, old, adv, chunks, trained, clip):
    """The authors' loop for one row: each trained chunk's ratio from the means, clipped, / train_chunks."""
    starts = [sum(chunks[:c]) for c in range(len(chunks))]
    total = 0.0
    for c in trained:
        span = slice(starts[c], starts[c] + chunks[c])
        ratio = torch.exp(new[span].mean() - old[span].mean())
        total = total + torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)) / len(trained)
    return total


@pytest.mark.parametrize("clip", [5e-5, 1.0])  # clipped chunks, and none
def test_chunk_loss_and_gradient_match_the_authors(clip):
    chunks, trained = [1, 2, 3], [[0, 2], [1, 2]]  # chunk sizes, chunks drawn for each row
    ids = chunk_ids(chunks, 6)
    mask = torch.stack([torch.isin(ids, torch.tensor(t)) for t in trained])
    new = (OLD + DELTA).requires_grad_()
    loss, _ = chunk_gspo(new, OLD, ADV.expand(2, 6), mask, chunks=chunks, clip_low=clip)
    ours = [aggregate(loss[i:i + 1], mask[i:i + 1], "token-mean") for i in range(2)]
    (grad_ours,) = torch.autograd.grad(sum(ours), new)
    new2 = (OLD + DELTA).requires_grad_()
    theirs = [authors_loss(new2[i], OLD[i], ADV[i, 0], chunks, trained[i], clip) for i in range(2)]
    (grad_theirs,) = torch.autograd.grad(sum(theirs), new2)
    torch.testing.assert_close(torch.stack(ours), torch.stack(theirs))
    torch.testing.assert_close(grad_ours, grad_theirs)


@pytest.mark.parametrize("chunk_mean", [True, False])
def test_one_chunk_is_gspo(chunk_mean):
    mask = torch.tensor([[True, True, False, True, True, True], [False, True, True, True, True, False]])
    a, b = (OLD + DELTA).requires_grad_(), (OLD + DELTA).requires_grad_()
    ours, m1 = policy_loss("chunk_gspo", a, OLD, ADV, mask, chunk_mean=chunk_mean, clip_low=5e-5)
    theirs, m2 = policy_loss("gspo", b, OLD, ADV, mask, clip_low=5e-5)
    torch.testing.assert_close(ours, theirs)
    ours.sum().backward(), theirs.sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
    assert m1.keys() == m2.keys() and m1["clip_frac"] == m2["clip_frac"]


def test_chunk_mean_off_weights_chunks_by_length():
    # chunks [1, 2]: log r 0.2 at step 0, 0.1 / 0.3 at steps 1-2: both chunk ratios e^0.2, every position -e^0.2
    loss, _ = chunk_gspo(torch.tensor([[0.2, 0.1, 0.3]]), torch.zeros(1, 3), torch.ones(1, 3),
                         torch.ones(1, 3, dtype=torch.bool), chunks=[1, 2], chunk_mean=False, clip_low=0.5)
    torch.testing.assert_close(loss, torch.full((1, 3), -torch.tensor(0.2).exp().item()))


def test_published_chunks_by_hand():
    # set_chunk with new_fix_chunk: [2, 3, 4, 7] over the first 16 of 17 steps; the last step is in no chunk
    assert chunk_ids([2, 3, 4, 7], 17).tolist() == [0] * 2 + [1] * 3 + [2] * 4 + [3] * 7 + [-1]
    assert resolve_policy_loss("chunk_gspo@gcpo", clip_low=5e-5) == ("chunk_gspo", {"chunks": [2, 3, 4, 7],
                                                                                    "clip_low": 5e-5})


def test_draw_takes_half_the_whole_chunks_seeded():
    chunks = [2, 3, 4, 7]
    draw = lambda seed: draw_chunks(chunks, 17, 8, 0.5, torch.Generator().manual_seed(seed))  # noqa: E731
    mask, ids = draw(3), chunk_ids(chunks, 17)
    for row in mask:
        drawn = set(ids[row].tolist())
        assert len(drawn) == 2 and row.sum() == sum(chunks[c] for c in drawn)  # int(4 * 0.5) whole chunks
    assert torch.equal(mask, draw(3)) and not torch.equal(mask, draw(4))


def test_weighted_draw_is_the_authors_multinomial():
    # sample_weight_method "normalized": F.normalize(chunk means + 1e-8, p=1) then multinomial without replacement
    chunks, steps = [1, 2, 2], torch.tensor([[0.1, 0.3, 0.5, 2.0, 1.0], [1.0, 0.0, 0.2, 0.1, 0.1]])
    got = draw_chunks(chunks, 5, 2, 0.5, torch.Generator().manual_seed(0), step_weights=steps)
    weights = torch.tensor([[0.1, 0.4, 1.5], [1.0, 0.1, 0.1]], dtype=torch.float64) + 1e-8
    perms = torch.multinomial(F.normalize(weights, p=1, dim=1), 3, replacement=False,
                              generator=torch.Generator().manual_seed(0))
    ids = chunk_ids(chunks, 5)
    assert torch.equal(got, ids[None, :] == perms[:, :1])  # int(3 * 0.5) = 1 chunk per row


def test_relative_l1_by_hand():
    states = torch.tensor([[[1.0, -3.0], [2.0, -1.0], [2.0, -1.0]]])  # |dx| means 1.5 then 0; |x| means 2, 1.5
    torch.testing.assert_close(relative_l1_changes(states), torch.tensor([[0.75, 0.0]]), atol=1e-6, rtol=0)


def test_bad_chunks_are_refused():
    with pytest.raises(ValueError, match="chunk sizes >= 1"):
        resolve_policy_loss("chunk_gspo", chunks=[2, 0])
    with pytest.raises(ValueError, match=r"trained steps \[5\] lie past the chunks"):
        chunk_gspo(OLD, OLD, ADV, torch.ones(2, 6, dtype=torch.bool), chunks=[2, 3])
    with pytest.raises(ValueError, match="cover 7 steps"):
        chunk_ids([3, 4], 6)
    with pytest.raises(ValueError, match="chunk weighting"):
        draw_chunks([1], 1, 1, 1.0, torch.Generator(), weighting="max")
