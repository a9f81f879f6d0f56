"""Blind set for lesson 00_first_kernel: written from the exercise text alone (lessons/00_first_kernel.ipynb)."""
import memfit  # noqa: F401  (first: picks Triton's interpreter on a machine without a GPU)

import functools
import math
import operator

import numpy as np
import torch
import triton
import triton.language as tl


# =============================================================================================
# Exercise 1: bytes_of(shape, dtype) -> int
# =============================================================================================

# ---- right ------------------------------------------------------------------------------------

def bytes_of_meta_device(shape, dtype) -> int:
    """A tensor on the meta device has a shape and a dtype but no storage: nothing is allocated."""
    return int(torch.empty(tuple(shape), dtype=dtype, device="meta").nbytes)


def bytes_of_reduce_itemsize(shape, dtype) -> int:
    """functools.reduce over the dims (initial 1, so () is one element) times dtype.itemsize."""
    return functools.reduce(operator.mul, (int(d) for d in shape), 1) * dtype.itemsize


def bytes_of_size_numel(shape, dtype) -> int:
    """torch.Size(...).numel() times the element size of a 0-d tensor (the notebook's hint)."""
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


# ---- wrong ------------------------------------------------------------------------------------

def bytes_of_allocates(shape, dtype) -> int:
    """Allocates the whole tensor to ask it its size."""
    t = torch.empty(tuple(shape), dtype=dtype)
    return t.numel() * t.element_size()


def bytes_of_empty_shape_zero(shape, dtype) -> int:
    """Treats the empty shape () as zero elements."""
    if len(shape) == 0:
        return 0
    return math.prod(shape) * dtype.itemsize


def bytes_of_min_one_element(shape, dtype) -> int:
    """'An empty shape is one element' over-applied: a shape with a 0 dimension also counts as one element."""
    return max(1, math.prod(shape)) * dtype.itemsize


def bytes_of_default_dtype_size(shape, dtype) -> int:
    """Forgets to pass dtype to the hint's torch.empty(()): always 4 bytes per element (right for fp32 only)."""
    return math.prod(shape) * torch.empty(()).element_size()


def bytes_of_dtype_table(shape, dtype) -> int:
    """A hand-written table of the course's dtypes, 4 bytes for anything else (fp64, int64, int8, bool...)."""
    sizes = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
    return math.prod(shape) * sizes.get(dtype, 4)


def bytes_of_finfo_bits(shape, dtype) -> int:
    """Element size from torch.finfo(dtype).bits: raises for integer and bool dtypes."""
    return math.prod(shape) * (torch.finfo(dtype).bits // 8)


def bytes_of_bits_over_8(shape, dtype) -> int:
    """Bits / 8 with true division: returns a float, not the Python int the text asks for."""
    if dtype == torch.bool:
        bits = 8
    elif dtype.is_floating_point:
        bits = torch.finfo(dtype).bits
    else:
        bits = torch.iinfo(dtype).bits
    return math.prod(shape) * bits / 8


def bytes_of_numpy_prod(shape, dtype) -> int:
    """np.prod: a numpy scalar, and np.prod(()) is the float 1.0, so bytes_of((), ...) is a float."""
    return np.prod(shape) * dtype.itemsize


# =============================================================================================
# Exercise 2: scaled_add_kernel + scaled_add(x, y, alpha, out=None)
# =============================================================================================

def _check_inputs(x, y):
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise ValueError(f"dtypes differ: {x.dtype} vs {y.dtype}")
    if x.device != y.device:
        raise ValueError(f"devices differ: {x.device} vs {y.device}")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("x and y must be contiguous")


def _check_out(out, x):
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError("out must have x's shape, dtype and device")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


@triton.jit
def _scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


def _launch(kernel, x, y, out, alpha, n=None):
    cfg = memfit.config("scaled_add")
    n = x.numel() if n is None else n
    grid = (triton.cdiv(n, cfg["BLOCK"]),)
    kernel[grid](x, y, out, n, alpha, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])
    return out


# ---- right ------------------------------------------------------------------------------------

def scaled_add_reference_like(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """The obvious solution (my own): checks, empty_like or out, one program per block of the config's BLOCK."""
    _check_inputs(x, y)
    if out is None:
        out = torch.empty_like(x)
    else:
        _check_out(out, x)
    if x.numel() == 0:
        return out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


@triton.jit
def _scaled_add_loop_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * (BLOCK * BLOCKS_PER_PROGRAM)
    for b in range(BLOCKS_PER_PROGRAM):
        offsets = start + b * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


def scaled_add_four_blocks_per_program(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Each program loops over 4 consecutive blocks (int64 offsets); fewer, longer programs, same result."""
    _check_inputs(x, y)
    if out is None:
        out = torch.empty_like(x)
    else:
        _check_out(out, x)
    n = x.numel()
    if n == 0:
        return out
    cfg = memfit.config("scaled_add")
    per = 4
    grid = (triton.cdiv(n, cfg["BLOCK"] * per),)
    _scaled_add_loop_kernel[grid](x, y, out, n, alpha, BLOCK=cfg["BLOCK"], BLOCKS_PER_PROGRAM=per,
                                  num_warps=cfg["num_warps"])
    return out


@triton.jit
def _scaled_add_fp32_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    res = x + alpha * y
    tl.store(out_ptr + offsets, res.to(out_ptr.dtype.element_ty), mask=mask)


def scaled_add_fp32_math_big_block(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Upcasts in registers (not in memory) to fp32, one rounding at the store; a block twice the config's."""
    _check_inputs(x, y)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_out(out, x)
    n = x.numel()
    if n == 0:
        return out
    cfg = memfit.config("scaled_add")
    block = 2 * cfg["BLOCK"]
    _scaled_add_fp32_kernel[(triton.cdiv(n, block),)](x, y, out, n, alpha, BLOCK=block,
                                                      num_warps=2 * cfg["num_warps"])
    return out


def scaled_add_grid_plus_one(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """grid = n // BLOCK + 1: one fully masked extra program when n is a multiple of BLOCK; harmless."""
    _check_inputs(x, y)
    if out is None:
        out = torch.empty_like(x)
    else:
        _check_out(out, x)
    n = x.numel()
    cfg = memfit.config("scaled_add")
    _scaled_add_kernel[(n // cfg["BLOCK"] + 1,)](x, y, out, n, alpha, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])
    return out


# ---- wrong: the kernel --------------------------------------------------------------------------

@triton.jit
def _unmasked_store_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, x + alpha * y)  # no mask: the last block writes past the end


def scaled_add_unmasked_store(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Masks the loads but not the store."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    return _launch(_unmasked_store_kernel, x, y, out, alpha)


@triton.jit
def _mask_le_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets <= n  # off by one: lane n is live
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


def scaled_add_mask_off_by_one(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Mask `offsets <= n`: writes exactly one element past the end of out."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    return _launch(_mask_le_kernel, x, y, out, alpha)


@triton.jit
def _mask_lane_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    offsets = pid * BLOCK + lanes
    mask = lanes < n  # the lane index, not the global offset: all-true once n >= BLOCK
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


def scaled_add_mask_lane_index(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Mask built from tl.arange alone: right for n < BLOCK, past-the-end reads and writes in a partial last block."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    return _launch(_mask_lane_kernel, x, y, out, alpha)


@triton.jit
def _unmasked_load_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)  # no mask: reads past the end of x and y
    y = tl.load(y_ptr + offsets)
    tl.store(out_ptr + offsets, x + alpha * y, mask=offsets < n)


def scaled_add_unmasked_loads(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Masks the store but not the loads (the text: 'load a block of x and y with a mask')."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    return _launch(_unmasked_load_kernel, x, y, out, alpha)


@triton.jit
def _swapped_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)  # scales the wrong operand


def scaled_add_alpha_on_x(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Computes alpha * x + y instead of x + alpha * y (equal when alpha == 1 or x == y)."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    return _launch(_swapped_kernel, x, y, out, alpha)


# ---- wrong: the launcher ------------------------------------------------------------------------

def scaled_add_grid_floor(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """grid = n // BLOCK: the partial last block gets no program (n < BLOCK gets none at all)."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    cfg = memfit.config("scaled_add")
    n = x.numel()
    grid = (n // cfg["BLOCK"],)
    if grid[0] > 0:
        _scaled_add_kernel[grid](x, y, out, n, alpha, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])
    return out


def scaled_add_len_not_numel(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """n = len(x) (the first dimension) instead of x.numel(): right for 1-D, only the first rows of a 2-D input."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    n = len(x) if x.dim() > 0 else 1
    return _launch(_scaled_add_kernel, x, y, out, alpha, n=n)


def scaled_add_n_in_bytes(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Exercise 1 carried along: n = x.nbytes (bytes, not elements) for the grid and the mask, so the kernel
    reads and writes element_size() times too far (the values up to numel are right)."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha, n=x.nbytes)


def scaled_add_flat_output(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Allocates a flat output torch.empty(n): right values, but 1-D for a 2-D (or 0-d) input."""
    _check_inputs(x, y)
    n = x.numel()
    out = torch.empty(n, dtype=x.dtype, device=x.device) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


def scaled_add_out_always_fp32(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.empty(x.shape, device=...) without dtype: fp16/bf16 inputs get an fp32 output (twice the bytes)."""
    _check_inputs(x, y)
    out = torch.empty(x.shape, device=x.device) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


def scaled_add_ignores_out(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Always allocates a fresh output; a given `out` is never written (and an extra output is allocated)."""
    _check_inputs(x, y)
    result = torch.empty_like(x)
    return _launch(_scaled_add_kernel, x, y, result, alpha)


def scaled_add_out_via_copy(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Computes into a fresh tensor, then out.copy_(result): right values, an extra output's bytes on the out= path."""
    _check_inputs(x, y)
    result = _launch(_scaled_add_kernel, x, y, torch.empty_like(x), alpha)
    if out is not None:
        out.copy_(result)
        return out
    return result


def scaled_add_default_out_is_x(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """'Allocates nothing': without out it writes in place into x (input overwritten, result aliases x)."""
    _check_inputs(x, y)
    out = x if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


def scaled_add_alpha_zero_shortcut(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns x itself when alpha == 0: the result aliases x and a given out is left unwritten."""
    _check_inputs(x, y)
    if alpha == 0:
        return x
    out = torch.empty_like(x) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


_OUTPUT_CACHE: dict = {}


def scaled_add_cached_output(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Keeps one output per (shape, dtype, device) in a global cache and returns it again: kept alive after return,
    and every call's result is the same tensor (the next call overwrites the previous result)."""
    _check_inputs(x, y)
    if out is None:
        key = (tuple(x.shape), x.dtype, str(x.device))
        if key not in _OUTPUT_CACHE:
            _OUTPUT_CACHE[key] = torch.empty_like(x)
        out = _OUTPUT_CACHE[key]
    return _launch(_scaled_add_kernel, x, y, out, alpha)


@triton.jit
def _add_kernel(x_ptr, t_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    t = tl.load(t_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + t, mask=mask)


def scaled_add_torch_scales_y(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Scales y in PyTorch (a temporary as large as the output) and only adds in the kernel."""
    _check_inputs(x, y)
    out = torch.empty_like(x) if out is None else out
    scaled = alpha * y
    return _launch(_add_kernel, x, scaled, out, alpha)


def scaled_add_torch_add_alpha(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """No Triton at all: torch.add(x, y, alpha=alpha) is one PyTorch kernel with no temporary."""
    _check_inputs(x, y)
    if out is None:
        return torch.add(x, y, alpha=alpha)
    return torch.add(x, y, alpha=alpha, out=out)


def scaled_add_upcast_inputs(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """'For accuracy' copies fp16/bf16 inputs to fp32 in PyTorch and casts the result back (no-op for fp32)."""
    _check_inputs(x, y)
    x32, y32 = x.float(), y.float()
    res = _launch(_scaled_add_kernel, x32, y32, torch.empty_like(x32), alpha)
    if out is None:
        return res.to(x.dtype)
    out.copy_(res)
    return out


@triton.jit
def _padded_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, x + alpha * y)  # the output is padded to whole blocks: no store mask needed


def scaled_add_padded_output(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Allocates the output rounded up to a whole number of blocks and returns a view of its first n elements:
    up to BLOCK - 1 elements of extra memory (with out given, it writes into a padded scratch and copies)."""
    _check_inputs(x, y)
    cfg = memfit.config("scaled_add")
    n = x.numel()
    padded = torch.empty(triton.cdiv(max(n, 1), cfg["BLOCK"]) * cfg["BLOCK"], dtype=x.dtype, device=x.device)
    _launch(_padded_kernel, x, y, padded, alpha)
    result = padded[:n].view(x.shape)
    if out is not None:
        out.copy_(result)
        return out
    return result


def scaled_add_no_contiguity_check(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Checks shape, dtype and device but not contiguity: a transposed or strided view is read as if it were flat."""
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError("x and y must have the same shape, dtype and device")
    out = torch.empty_like(x) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


def scaled_add_numel_only_check(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Compares numel() instead of shape: x of shape (2, 3) and y of shape (3, 2) or (6,) are accepted."""
    if x.numel() != y.numel():
        raise ValueError("x and y must have the same number of elements")
    if x.dtype != y.dtype or x.device != y.device:
        raise ValueError("x and y must have the same dtype and device")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("x and y must be contiguous")
    out = torch.empty_like(x) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


def scaled_add_no_dtype_check(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Skips the dtype check: fp32 x with fp16 y runs (the kernel mixes them) instead of raising."""
    if x.shape != y.shape:
        raise ValueError("x and y must have the same shape")
    if x.device != y.device:
        raise ValueError("x and y must be on the same device")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("x and y must be contiguous")
    out = torch.empty_like(x) if out is None else out
    return _launch(_scaled_add_kernel, x, y, out, alpha)


# =============================================================================================

_WRONG_NUMERICS = [
    "scaled_add_unmasked_store",
    "scaled_add_mask_off_by_one",
    "scaled_add_mask_lane_index",
    "scaled_add_unmasked_loads",
    "scaled_add_alpha_on_x",
    "scaled_add_n_in_bytes",
    "scaled_add_grid_floor",
    "scaled_add_len_not_numel",
    "scaled_add_flat_output",
    "scaled_add_out_always_fp32",
    "scaled_add_ignores_out",
    "scaled_add_default_out_is_x",
    "scaled_add_alpha_zero_shortcut",
    "scaled_add_cached_output",
    "scaled_add_no_contiguity_check",
    "scaled_add_numel_only_check",
    "scaled_add_no_dtype_check",
]

_WRONG_MEMORY = [
    "scaled_add_out_always_fp32",
    "scaled_add_ignores_out",
    "scaled_add_out_via_copy",
    "scaled_add_cached_output",
    "scaled_add_torch_scales_y",
    "scaled_add_torch_add_alpha",
    "scaled_add_upcast_inputs",
    "scaled_add_padded_output",
]

_WRONG_GPU = [
    "scaled_add_unmasked_store",
    "scaled_add_n_in_bytes",
    "scaled_add_mask_lane_index",
    "scaled_add_alpha_on_x",
    "scaled_add_grid_floor",
    "scaled_add_out_always_fp32",
    "scaled_add_torch_scales_y",
    "scaled_add_upcast_inputs",
]

_RIGHT_SCALED_ADD = [
    "scaled_add_reference_like",
    "scaled_add_four_blocks_per_program",
    "scaled_add_fp32_math_big_block",
    "scaled_add_grid_plus_one",
]

BLIND = {
    "bytes_of": {
        "wrong": [
            "bytes_of_allocates",
            "bytes_of_empty_shape_zero",
            "bytes_of_min_one_element",
            "bytes_of_default_dtype_size",
            "bytes_of_dtype_table",
            "bytes_of_finfo_bits",
            "bytes_of_bits_over_8",
            "bytes_of_numpy_prod",
        ],
        "right": ["bytes_of_meta_device", "bytes_of_reduce_itemsize", "bytes_of_size_numel"],
    },
    "scaled_add_numerics": {"wrong": list(_WRONG_NUMERICS), "right": list(_RIGHT_SCALED_ADD)},
    "scaled_add_memory": {"wrong": list(_WRONG_MEMORY), "right": list(_RIGHT_SCALED_ADD)},
    "scaled_add_gpu": {"wrong": list(_WRONG_GPU), "right": list(_RIGHT_SCALED_ADD)},
}

WHY = {
    "bytes_of_allocates": "allocates the tensor to measure it; violates 'Do not allocate the tensor'",
    "bytes_of_empty_shape_zero": "returns 0 for shape (); violates 'an empty shape () is one element'",
    "bytes_of_min_one_element": "max(1, numel): a shape with a 0 dim gets one element's bytes; misreads 'an empty shape () is one element'",
    "bytes_of_default_dtype_size": "torch.empty(()) without dtype: always 4 bytes/element; violates 'shape and dtype' (right only for fp32)",
    "bytes_of_dtype_table": "hand table of fp32/fp16/bf16, 4 for anything else; wrong for fp64/int64/int8/bool ('any dtype')",
    "bytes_of_finfo_bits": "torch.finfo(dtype).bits raises for integer/bool dtypes; the function takes any dtype",
    "bytes_of_bits_over_8": "bits / 8 with true division returns a float; violates 'as a Python int'",
    "bytes_of_numpy_prod": "np.prod gives a numpy scalar (np.prod(()) is the float 1.0); violates 'as a Python int'",
    "scaled_add_unmasked_store": "store without mask writes past the end; violates 'store it with the mask' / 'nothing past the end'",
    "scaled_add_mask_off_by_one": "mask offsets <= n writes one element past the end; violates mask 'offsets < n' / 'nothing past the end'",
    "scaled_add_mask_lane_index": "mask tl.arange(0, BLOCK) < n ignores pid: partial last block reads/writes past the end; violates mask 'offsets < n'",
    "scaled_add_unmasked_loads": "loads without mask read past the end of x and y; violates 'load a block of x and y with a mask'",
    "scaled_add_alpha_on_x": "computes alpha*x + y; violates 'out = x + alpha * y' (hides at alpha=1)",
    "scaled_add_n_in_bytes": "passes x.nbytes as n (bytes, not elements): grid and mask 2-4x too long, writes past the end; violates mask 'offsets < n' for n elements / 'nothing past the end'",
    "scaled_add_grid_floor": "grid n // BLOCK misses the partial last block; violates 'one program per block' for lengths not multiples of the block",
    "scaled_add_len_not_numel": "n = len(x) covers only the first dim of multi-dim inputs; 'same shape' inputs of any rank",
    "scaled_add_flat_output": "allocates torch.empty(n): result is 1-D for N-D inputs; output should have x's shape",
    "scaled_add_out_always_fp32": "output allocated without dtype is fp32 for fp16/bf16 inputs; wrong dtype and 2x bytes ('every dtype', 'bytes of its output')",
    "scaled_add_ignores_out": "never writes into a given out; violates 'write into out and return it'",
    "scaled_add_out_via_copy": "writes into a fresh tensor then out.copy_: extra output-sized allocation and PyTorch copy on the out= path; violates 'allocates nothing beyond its output'",
    "scaled_add_default_out_is_x": "without out writes in place into x: input overwritten, result aliases x; violates 'allocate the output if out is not given'",
    "scaled_add_alpha_zero_shortcut": "returns x itself for alpha == 0: aliases the input and skips writing out; violates 'write into out and return it'",
    "scaled_add_cached_output": "global cached output reused across calls: memory kept alive after return, results alias each other; violates 'allocate the output'",
    "scaled_add_torch_scales_y": "alpha * y computed by PyTorch (a temporary as big as the output); violates 'PyTorch did none of the arithmetic' / budget output+5%",
    "scaled_add_torch_add_alpha": "torch.add(x, y, alpha=...) instead of a Triton kernel; violates 'in one Triton kernel' / 'PyTorch did none of the arithmetic'",
    "scaled_add_upcast_inputs": "copies fp16/bf16 inputs to fp32 in PyTorch and casts back: several extra tensors; violates budget 'bytes of its output + 5%'",
    "scaled_add_padded_output": "output padded to whole blocks to skip the store mask: up to BLOCK-1 extra elements (64x for n=17); violates 'bytes of its output + 5%'",
    "scaled_add_no_contiguity_check": "skips the contiguity check; strided views are read as flat memory; violates 'check the inputs (... contiguous)'",
    "scaled_add_numel_only_check": "checks numel instead of shape, accepting (2,3) with (3,2); violates 'check the inputs (same shape ...)'",
    "scaled_add_no_dtype_check": "skips the dtype check, mixing fp32 and fp16 silently; violates 'check the inputs (same ... dtype ...)'",
    "bytes_of_meta_device": "RIGHT: meta-device tensor's nbytes, no storage allocated",
    "bytes_of_reduce_itemsize": "RIGHT: reduce(mul, shape, 1) * dtype.itemsize",
    "bytes_of_size_numel": "RIGHT: torch.Size(shape).numel() * 0-d tensor element_size (the hint)",
    "scaled_add_reference_like": "RIGHT: the obvious masked kernel, config BLOCK, empty_like/out, early return for n=0",
    "scaled_add_four_blocks_per_program": "RIGHT: each program loops over 4 blocks with int64 offsets",
    "scaled_add_fp32_math_big_block": "RIGHT: fp32 math in registers, single rounding at the store, block 2x the config",
    "scaled_add_grid_plus_one": "RIGHT: grid n // BLOCK + 1 (one extra fully masked program at multiples of BLOCK)",
}
