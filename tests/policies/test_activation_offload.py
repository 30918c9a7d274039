"""Activation offload (``activation_offload: true``, every family): the training pass's gradients are the same
numbers with and without it, with and without gradient checkpointing, and every tensor the pass saves for its
backward except the weights goes to the host as a copy (on a CPU the copy is all it does; on an accelerator the copy
is what frees the accelerator's memory)."""

import inspect

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

import flowrl.policies
from flowrl.policies import FlowPolicy, TinyFlowPolicy
from tests.policies.test_wan import PROMPTS, wan


def saved_in_the_denoiser(policy, loss_fn) -> tuple[int, int]:
    """``(activation bytes, saved weights)`` the denoiser's forward saves for the backward in a pass, a weight told
    by its storage: an independent probe of the same pass."""
    found, storages = [0, 0], {w.untyped_storage().data_ptr() for w in policy.parameters()}

    def pack(t):
        if t.untyped_storage().data_ptr() in storages:
            found[1] += 1
        else:
            found[0] += t.nbytes
        return t

    forward = policy.denoiser.forward

    def probed(*args, **kwargs):
        with saved_tensors_hooks(pack, lambda t: t):
            return forward(*args, **kwargs)

    policy.denoiser.forward = probed
    loss_fn().backward()
    return found[0], found[1]


def wan22(wan_dirs, **kw):
    return wan(wan_dirs["wan22"], **kw)


def tiny(_dirs, **kw):
    return TinyFlowPolicy(**kw).load()


def pass_of(policy):
    """A training pass with CFG; on Wan 2.2 one row on each expert."""
    torch.manual_seed(1)
    with torch.no_grad():  # trained LoRA B weights (they start at zero, which would zero most gradients)
        for p in policy.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
    z, cond = torch.randn(2, *policy.latent_shape()), policy.encode(PROMPTS)
    sigma = policy.sigmas(6)[[0, 5]]
    policy.train()
    return lambda: policy.velocity(z, sigma, cond, 3.0).square().mean()


@pytest.mark.parametrize("make, checkpointing", [(wan22, False), (wan22, True), (tiny, False)],
                         ids=["wan22", "wan22-checkpointing", "tiny"])
def test_offload_gives_the_same_gradients_and_moves_every_saved_activation_to_the_host(wan_dirs, make,
                                                                                       checkpointing):
    extra = {"gradient_checkpointing": checkpointing} if make is wan22 else {}
    grads, saved = [], None
    for offload in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation (peft draws it)
        policy = make(wan_dirs, activation_offload=offload, **extra)
        loss_fn = pass_of(policy)
        if not offload:
            saved, weights = saved_in_the_denoiser(policy, loss_fn)
            assert saved > 0 and weights > 0  # the linear layers save their weights: those must stay
        else:
            packed, storages = [], {w.untyped_storage().data_ptr() for w in policy.parameters()}
            inner = policy.offload.pack_hook
            policy.offload.pack_hook = lambda t: packed.append((t, inner(t))) or packed[-1][1]
            loss_fn().backward()
            for original, out in packed:
                if original.untyped_storage().data_ptr() in storages:
                    assert out is original  # a weight stays where it is
                else:  # (device, host copy): a copy in host memory, not the tensor itself
                    device, host = out
                    assert device == original.device and host.device.type == "cpu"
                    assert host.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
            # exactly what the pass without offload saves, weights aside, went to the host
            assert policy.offload.stored_bytes == saved
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=0, rtol=0)  # the backward reads exact copies


def test_without_the_option_nothing_is_offloaded(wan_dirs):
    policy = wan22(wan_dirs)
    assert not hasattr(policy, "offload")
    assert not policy.denoiser._forward_pre_hooks and not policy.denoiser._forward_hooks


def test_every_family_has_the_option_off_by_default():
    families = [cls for cls in vars(flowrl.policies).values()
                if isinstance(cls, type) and issubclass(cls, FlowPolicy) and cls is not FlowPolicy]
    assert len(families) >= 10
    for cls in families:
        params = inspect.signature(cls.__init__).parameters
        if "activation_offload" not in params:  # a family that passes **kwargs on to its base's (WanI2VPolicy)
            assert any(p.kind is p.VAR_KEYWORD for p in params.values()), cls
            params = inspect.signature(cls.__mro__[1].__init__).parameters
        assert params["activation_offload"].default is False, cls
