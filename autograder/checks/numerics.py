"""Comparing a learner's tensor with a reference, by the course's rule.

The rule (FlashAttention's): the learner's max error against a float64 reference may be at most
2x the error PyTorch makes computing the same thing in the same dtype, plus a small floor. Before
comparing: shape, dtype and device must match, and no element may be NaN (outputs are poisoned
with NaN before the call, so an element the code never wrote shows up).
"""
from __future__ import annotations

import contextlib

import torch

import memfit
from autograder.checks import CheckFailed


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def case_dtypes(hidden: bool) -> tuple[torch.dtype, ...]:
    """Visible cases run in fp32; hidden ones in every dtype this machine's profile supports."""
    return memfit.profile().dtypes if hidden else (torch.float32,)


def training_half() -> torch.dtype:
    """The 16-bit dtype this machine trains in: bf16 where it has bf16 tensor cores, else fp16."""
    return torch.bfloat16 if memfit.profile().bf16_tensor_cores else torch.float16


def seeded_randn(shape, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """The same numbers on every device: drawn on the CPU from a seeded generator, then moved."""
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype=dtype, device=memfit.DEVICE)


def expect_like(got, ref: torch.Tensor, what: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{what}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(ref.shape):
        raise CheckFailed(f"{what}: expected shape {tuple(ref.shape)}, got {tuple(got.shape)}")
    if got.dtype != ref.dtype:
        raise CheckFailed(f"{what}: expected dtype {dtype_name(ref.dtype)}, got {dtype_name(got.dtype)}")
    if got.device != ref.device:
        raise CheckFailed(f"{what}: expected a tensor on {ref.device}, got one on {got.device}")


def assert_close_by_rule(got: torch.Tensor, exact: torch.Tensor, torch_same_dtype: torch.Tensor,
                         what: str, floor_ulps: float = 2.0) -> None:
    """got and torch_same_dtype: results in the working dtype; exact: the float64 reference."""
    expect_like(got, torch_same_dtype, what)
    got64 = got.detach().to(torch.float64).flatten()
    exact64 = exact.detach().to(torch.float64).flatten()
    unwritten = torch.isnan(got64) & ~torch.isnan(exact64)
    if unwritten.any():
        first = int(unwritten.nonzero()[0])
        raise CheckFailed(f"{what}: {int(unwritten.sum())} of {got64.numel()} output elements are NaN, "
                          f"first at index {first}: they were never written (check your mask and grid) or computed as NaN "
                          "(an exp that overflowed, -inf minus -inf)")
    if got64.numel() == 0:
        return
    torch_err = (torch_same_dtype.detach().to(torch.float64).flatten() - exact64).abs().max().item()
    scale = max(1.0, exact64.abs().max().item())
    floor = floor_ulps * torch.finfo(got.dtype).eps * scale
    tol = 2 * torch_err + floor
    err = (got64 - exact64).abs()
    worst = int(err.argmax())
    if err[worst].item() > tol:
        raise CheckFailed(
            f"{what}: max |error| {err[worst].item():.3g} at index {worst} (expected {exact64[worst].item():.6g}, "
            f"got {got64[worst].item():.6g}) exceeds the tolerance {tol:.3g} = 2 x PyTorch's "
            f"{dtype_name(got.dtype)} error {torch_err:.3g} + floor {floor:.3g}")


# Elements of NaN after an `out` a check passes: an unmasked store of up to one block past the end lands
# here, where the check sees it, instead of in memory that is not ours (a crash, or silent corruption).
GUARD_ELEMENTS = 4096

# Arithmetic a Triton kernel should do itself: seeing one of these ops means PyTorch did the work.
TORCH_ARITHMETIC = frozenset({
    "aten.add", "aten.add_", "aten.add_out", "aten.sub", "aten.rsub", "aten.mul", "aten.mul_", "aten.mul_out",
    "aten.div", "aten.addcmul", "aten.lerp", "aten.where", "aten.mm", "aten.addmm", "aten.pow", "aten.pow_",
    "aten.square", "aten.rsqrt", "aten.sigmoid", "aten.silu", "aten.mean", "aten.exp", "aten.exp2", "aten.bmm",
    "aten.baddbmm", "aten._softmax", "aten.logsumexp", "aten.amax",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention"})


def expect_no_torch_arithmetic(ops, what: str, hint: str = "the math belongs in your kernel") -> None:
    """ops: the op counts the live-tensor meter recorded while the learner's function ran."""
    used = sorted(set(ops) & TORCH_ARITHMETIC)
    if used:
        raise CheckFailed(f"{what}: PyTorch did arithmetic ({', '.join(used)}): {hint}")


@contextlib.contextmanager
def poisoned_allocations():
    """While active, torch.empty and torch.empty_like return floating-point tensors filled with NaN, on any
    device (on a CPU fresh memory is often zero, which hides an element the kernel never wrote)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *args, **kwargs: poison(empty(*args, **kwargs))
    torch.empty_like = lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
