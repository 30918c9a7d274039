"""The mixed-precision contract every pipeline adapter keeps, checked the same way for each."""

import torch


def assert_mixed_precision(policy, reference, sigma, guidance: float) -> None:
    """``policy`` (bf16 frozen weights, bf16 autocast, gradient checkpointing) against ``reference`` (float32): the
    frozen encoders are bf16, the trained weights and the model output float32, the output within bf16 error of the
    reference's, and the backward pass reaches every trained weight."""
    assert policy.text_encoder.dtype == policy.vae.dtype == torch.bfloat16
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}
    cond, ref_cond = policy.encode(["a red cat"]), reference.encode(["a red cat"])
    z = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(0))  # not the suite's RNG state
    policy.train()
    out = policy.velocity(z, sigma, cond, guidance)
    out.square().mean().backward()  # through gradient checkpointing
    with torch.no_grad():
        want = reference.velocity(z, sigma, ref_cond, guidance)
    assert out.dtype == torch.float32
    assert (out - want).abs().max() < 0.05 * want.abs().max()  # bf16 weights and compute: ~1e-2 relative
    assert all(p.grad is not None for p in policy.trainable_parameters())
