"""Checks of lesson 00 (solutions/00_first_kernel.ipynb): bytes of a tensor; a masked Triton kernel."""
from __future__ import annotations

import math

import torch

import memfit
from autograder.checks import Check, KernelSpec, CheckFailed, call_learner, check_cases, skip
from autograder.checks.numerics import (GUARD_ELEMENTS, assert_close_by_rule, expect_like,
                                        expect_no_torch_arithmetic)
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak

# ----------------------------------------------------------------------------------- bytes_of

def _true_bytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


BYTES_VISIBLE = [((4096, 4096), torch.float32), ((3, 5), torch.float16)]
BYTES_HIDDEN = [((), torch.float16), ((3, 0, 5), torch.bfloat16), ((128256, 4096), torch.bfloat16),
                ((7,), torch.int8), ((2, 3), torch.float64), ((1000,), torch.bool), ((8, 8), torch.int64)]


def check_bytes_of(bytes_of, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for shape, dtype in (BYTES_VISIBLE if visible else []) + (BYTES_HIDDEN if hidden else []):
        got = call_learner(bytes_of, shape, dtype, what=f"bytes_of({shape}, {dtype})")
        want = _true_bytes(shape, dtype)
        if not isinstance(got, int) or isinstance(got, bool):
            raise CheckFailed(f"bytes_of({shape}, {dtype}) should return an int, got {type(got).__name__} {got!r}")
        if got != want:
            raise CheckFailed(f"bytes_of({shape}, {dtype}): expected {want:,} bytes, got {got:,}")


# --------------------------------------------------------------------------------- scaled_add

def _inputs(n: int, dtype: torch.dtype, device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen).to(dtype=dtype, device=device)
    y = torch.randn(n, generator=gen).to(dtype=dtype, device=device)
    alpha = float(torch.empty(()).uniform_(-2, 2, generator=gen))
    return x, y, alpha


def _check_one(scaled_add, n: int, dtype: torch.dtype, device, seed: int) -> None:
    x, y, alpha = _inputs(n, dtype, device, seed)
    what = f"scaled_add(x, y, alpha={alpha:.4f}) with n={n}, dtype={str(dtype).replace('torch.', '')}"
    exact = x.double() + alpha * y.double()
    torch_same = x + alpha * y
    # 1. out= a NaN-poisoned view into a larger buffer: every element written, nothing past the end.
    #    First, so that a missing store mask is caught where its writes land in our guard.
    pad = GUARD_ELEMENTS
    buffer = torch.full((n + pad,), float("nan"), dtype=dtype, device=device)
    out = buffer[:n]
    got = call_learner(scaled_add, x, y, alpha, out=out, what=what + " and out=")
    if got is not out:
        raise CheckFailed(f"{what}: with out= given, scaled_add must write into it and return it")
    assert_close_by_rule(out, exact, torch_same, what + " (into out=)")
    spill = ~torch.isnan(buffer[n:])
    if spill.any():
        raise CheckFailed(f"{what}: wrote {int(spill.sum())} elements past the end of out (index {n} onward): "
                          "mask the store with offsets < n")
    # 2. out=None: a new tensor.
    got = call_learner(scaled_add, x, y, alpha, what=what)
    assert_close_by_rule(got, exact, torch_same, what)


def check_scaled_add_numerics(scaled_add, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    device = memfit.DEVICE
    plan = []
    if visible:
        plan += [(n, torch.float32) for n in (1, 17, 1000)]
    if hidden:
        large = memfit.size("first_kernel", memfit.hardware.profile_for("cpu"))["n_check_large"]
        plan += [(n, dtype) for n in (1023, 1024, 1025, 4097, large) for dtype in memfit.profile().dtypes]
    for seed, (n, dtype) in enumerate(plan):
        _check_one(scaled_add, n, dtype, device, seed)


def _memory_budget(out_bytes: int) -> int:
    """One output tensor, with 5% for allocator rounding."""
    return math.ceil(1.05 * out_bytes)


def _check_memory(scaled_add, n: int, dtype: torch.dtype, device, meter=None) -> None:
    x, y, alpha = _inputs(n, dtype, device, seed=1234)
    what = f"scaled_add at n={n:,}, {str(dtype).replace('torch.', '')}"
    out, report = measure_peak(lambda: call_learner(scaled_add, x, y, alpha, what=what), device=device, meter=meter)
    expect_like(out, x, what)
    out_bytes = out.numel() * out.element_size()
    budget = _memory_budget(out_bytes)
    if report.peak_bytes > budget:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} ({report.meter}) exceeds "
                          f"the budget {format_bytes(budget)} (the output, {format_bytes(out_bytes)}, + 5%): "
                          "compute in one kernel without temporaries")
    if report.meter != LIVE_TENSORS:  # only the live-tensor meter records the ops the call dispatched
        _, report = measure_peak(lambda: call_learner(scaled_add, x, y, alpha, what=what), device=device,
                                 meter=LIVE_TENSORS, warmup=False)
    expect_no_torch_arithmetic(report.ops, what, "the sum must be computed by your Triton kernel")


def check_scaled_add_memory(scaled_add, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    sizes = memfit.size("first_kernel", memfit.hardware.profile_for("cpu"))
    if visible:
        _check_memory(scaled_add, 4097, torch.float32, memfit.DEVICE)
    if hidden:
        _check_memory(scaled_add, sizes["n_check_large"], torch.float16, memfit.DEVICE)


def check_scaled_add_gpu(scaled_add, cases: str = "visible") -> None:
    """The compiled kernel at GPU scale: numerics in every dtype the card has, memory by the CUDA allocator."""
    if not torch.cuda.is_available():
        return skip("skipped: needs a GPU (checks the compiled kernel on ~16M elements, "
                    "memory measured by the CUDA allocator)")
    visible, hidden = check_cases(cases)
    n = memfit.size("first_kernel")["n_check_large"]
    dtypes = memfit.profile().dtypes if hidden else (torch.float16,)
    for seed, dtype in enumerate(dtypes):
        _check_one(scaled_add, n, dtype, memfit.DEVICE, seed=100 + seed)
        _check_memory(scaled_add, n, dtype, memfit.DEVICE)
    print(f"scaled_add: GPU checks passed ({', '.join(str(d).replace('torch.', '') for d in dtypes)}, n={n:,})")


CHECKS = [
    Check("bytes_of", 2, check_bytes_of, uses=("bytes_of",)),
    Check("scaled_add_numerics", 4, check_scaled_add_numerics, uses=("scaled_add",)),
    Check("scaled_add_memory", 2, check_scaled_add_memory, uses=("scaled_add",)),
    Check("scaled_add_gpu", 2, check_scaled_add_gpu, uses=("scaled_add",), needs_gpu=True),
]

KERNELS = [
    KernelSpec("scaled_add_kernel", "scaled_add",
               {"x_ptr": "*{dtype}", "y_ptr": "*{dtype}", "out_ptr": "*{dtype}", "n": "i32", "alpha": "fp32"}),
]
