"""Model evaluations counted through the policy's real forward calls, for the NFE tests of every method."""

import torch


def counted_rollout(method, batch):
    """``method.rollout(batch)`` and the model evaluations it took per batch row (a prompt's trajectory, or its
    tree): rows of real forward calls, a classifier-free-guidance pair counted once."""
    rows = []
    forward = method.policy._forward

    def counting(latents, *args):
        rows.append(latents.shape[0])
        return forward(latents, *args)

    method.policy._forward = counting
    try:
        with torch.no_grad():
            rollout = method.rollout(batch, method.policy.encode(batch["prompts"]))
    finally:
        del method.policy._forward
    pairs = 2 if method.guidance_scale > 1 else 1
    return rollout, sum(rows) / pairs / len(batch["seeds"])
