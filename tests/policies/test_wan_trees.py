"""Tree methods on video latents ``[C, F, h, w]``: the tree sampler keeps each shared state once (``node_latents``
holds at most 10% more tensors than there are distinct states), far below the dense ``[B, T+1]`` buffer a tree's
leaves would otherwise hold."""

import pytest
import torch

from flowrl.methods import TempFlowGRPO, TreeRPO
from tests.methods.counting import counted_rollout
from tests.policies.test_wan import wan

BATCH = {"prompts": ["a red cat", "a blue dog"], "group_ids": torch.arange(2), "seeds": torch.tensor([7, 8])}


def tree_rpo(policy):
    method = TreeRPO(policy, num_steps=5, window_size=2, window_start=1, guidance_scale=2.0)
    method.trainer = type("T", (), {"global_step": 0})()  # the window's position
    return method


@pytest.mark.parametrize("make", [lambda p: TempFlowGRPO(p, num_steps=5, branches=3, guidance_scale=2.0), tree_rpo],
                         ids=["tempflow", "tree_rpo"])
def test_a_video_tree_stores_each_shared_state_once(wan_dirs, make):
    policy = wan(wan_dirs["wan21"])
    rollout, _ = counted_rollout(make(policy), BATCH)
    stored = rollout.node_latents
    assert stored.shape[1:] == (16, 3, 4, 4)  # video latents: channels, latent frames, height, width
    distinct = torch.unique(stored.flatten(1), dim=0).shape[0]  # by content: a prefix shared by leaves counts once
    assert len(stored) / distinct <= 1.1
    rows_states = rollout.states(*(rollout.state_index >= 0).nonzero().T)  # every state a row reads
    assert torch.unique(rows_states.flatten(1), dim=0).shape[0] <= distinct
    dense = rollout.batch_size * (rollout.num_steps + 1)  # what [B, T+1] latents would hold
    assert rollout.batch_size > len(BATCH["seeds"]) and len(stored) < 0.6 * dense
