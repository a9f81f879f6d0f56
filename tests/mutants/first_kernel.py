"""Known-wrong (and known-right alternative) implementations of lesson 00's exercises.

Each wrong one must lose the points of the check named beside it; each right alternative keeps
them. Importing memfit first decides TRITON_INTERPRET before triton is imported.
"""
import math

import memfit  # noqa: F401
import torch
import triton
import triton.language as tl


# ------------------------------------------------------------------------------------ bytes_of
def bytes_of_assumes_fp32(shape, dtype):
    return math.prod(shape) * 4


def bytes_of_counts_dims(shape, dtype):  # sums the dims instead of multiplying them
    return sum(shape) * dtype.itemsize


def bytes_of_returns_float(shape, dtype):
    return float(math.prod(shape) * dtype.itemsize)


def bytes_of_by_allocating(shape, dtype):  # right, if wasteful
    t = torch.empty(shape, dtype=dtype, device="meta")
    return t.numel() * t.element_size()


# ---------------------------------------------------------------------------------- scaled_add
@triton.jit
def _kernel_no_store_mask(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x + alpha * y)  # no mask: writes past the end


@triton.jit
def _kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)


@triton.jit
def _kernel_alpha_on_x(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _validate(x, y, out):  # as the exercise asks: every mutant fails for its own bug, not for a missing check
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError("x and y must have the same shape, dtype and device")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("x and y must be contiguous")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError("out must be a contiguous tensor like x")


def _launch(kernel, x, y, alpha, out, block=256, grid=None):
    _validate(x, y, out)
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    kernel[grid or (triton.cdiv(n, block),)](x, y, out, n, alpha, BLOCK=block)
    return out


def scaled_add_no_store_mask(x, y, alpha, out=None):
    return _launch(_kernel_no_store_mask, x, y, alpha, out)


def scaled_add_grid_floor(x, y, alpha, out=None):  # n // BLOCK programs: the tail is never written
    return _launch(_kernel, x, y, alpha, out, grid=(max(1, x.numel() // 256),))


def scaled_add_alpha_on_x(x, y, alpha, out=None):
    return _launch(_kernel_alpha_on_x, x, y, alpha, out)


def scaled_add_ignores_out(x, y, alpha, out=None):
    return _launch(_kernel, x, y, alpha, None)


def scaled_add_in_pytorch(x, y, alpha, out=None):
    _validate(x, y, out)
    result = x + alpha * y
    if out is not None:
        out.copy_(result)
        return out
    return result


def scaled_add_fp32_temporaries(x, y, alpha, out=None):  # right answer, but upcasts: 2 extra tensors
    _validate(x, y, out)
    xf, yf = x.float(), y.float()
    res = _launch(_kernel, xf, yf, alpha, None)
    if out is None:
        return res.to(x.dtype)
    out.copy_(res)
    return out


def scaled_add_block_64(x, y, alpha, out=None):  # right: another block size
    return _launch(_kernel, x, y, alpha, out, block=64)


def scaled_add_block_4096(x, y, alpha, out=None):  # right: one program may cover everything
    return _launch(_kernel, x, y, alpha, out, block=4096)
