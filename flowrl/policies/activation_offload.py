"""Activation offload: the tensors a training forward saves for its backward wait in host memory.

Beyond its weights, a training pass holds what every layer saves for the backward (inputs of the linear layers,
attention outputs, norms' statistics): the part of its memory that grows with the tokens, i.e. with a video's frames
and resolution. Under a policy's ``activation_offload`` option the denoiser's forward runs under torch's
:class:`torch.autograd.graph.save_on_cpu` (pinned host memory): each saved tensor is copied to the host as the
forward saves it and back as the backward reads it, so the accelerator keeps the weights and the working set of the
layer that runs. The gradients are the same numbers: the backward reads exact copies.

One change to torch's hooks: parameters (and views of them) stay where they are. ``save_on_cpu`` packs every saved
tensor, and each linear layer saves its weight (for the input's gradient), so it would copy the whole model to the
host in every forward (under FSDP2, every gathered block) though the weights already live on the accelerator; only
activations go to the host here. Under ``autocast`` a float32 weight's low-precision cast is a new tensor, copied
like an activation: keep the frozen weights in ``torch_dtype`` so that none is cast. With gradient checkpointing a
block saves nothing but its inputs (torch's non-reentrant checkpoint saves them through the same hooks), so the two
combine: the inputs then wait on the host as well.

Cost: two copies of every saved byte over the host link per pass (to the host in the forward, back in the
backward), on the compute stream (``save_on_cpu`` does not overlap them with compute), and that much pinned host
memory per micro-batch. On a CPU it buys nothing (the tensors are in host memory already) and only adds the copies.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks


def is_weight(tensor: Tensor) -> bool:
    """Whether a saved tensor is a parameter or a view of one (a linear layer saves its weight transposed).

    >>> w = nn.Parameter(torch.ones(2, 3))
    >>> is_weight(w), is_weight(w.t()), is_weight(w * 2)
    (True, True, False)
    """
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


class ActivationOffload(saved_tensors_hooks):
    """``save_on_cpu(pin_memory=True)`` that leaves parameters in place. ``stored_bytes`` counts the bytes it has
    copied to the host (each saved tensor as packed; a diagnostic the tests and benchmarks read).

    >>> w = nn.Parameter(torch.ones(3, 3))
    >>> offload = ActivationOffload()
    >>> with offload:
    ...     y = (torch.ones(4, 3, requires_grad=True) @ w).square().sum()  # saves the input, w and the product
    >>> offload.stored_bytes  # the input and the product, 2 x (4 x 3) float32; w stays
    96
    """

    def __init__(self):
        # torch's pack and unpack (pinned: a copy, even of a CPU tensor)
        host = torch.autograd.graph.save_on_cpu(pin_memory=True)
        self.stored_bytes = 0

        def pack(tensor: Tensor):
            if is_weight(tensor):
                return tensor
            self.stored_bytes += tensor.nbytes
            return host.pack_hook(tensor)

        def unpack(packed) -> Tensor:
            return packed if isinstance(packed, Tensor) else host.unpack_hook(packed)

        super().__init__(pack, unpack)


def offload_activations(module: nn.Module) -> ActivationOffload:
    """Run every forward of ``module`` under one :class:`ActivationOffload` (forward hooks enter and leave it; the
    leaving one runs even when the forward raises). A forward without autograd (sampling, the reference) saves
    nothing, so nothing is copied."""
    offload = ActivationOffload()
    module.register_forward_pre_hook(lambda _module, _args: offload.__enter__())
    module.register_forward_hook(lambda _module, _args, _out: offload.__exit__(None, None, None),
                                 always_call=True)
    return offload
