"""Blind set for lesson 07_quantization: written from the exercise text alone (lessons/07_quantization.ipynb)."""
import memfit  # noqa: F401  (before triton: without a GPU it selects Triton's interpreter)

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from memfit.from_lessons.quantization import (  # the lesson's given helpers (non-exercise cells)
    QK, STATE_BLOCK, Quantized, check_float_tensor, check_int8_matmul_inputs, check_quantized, dynamic_code,
    empty_quantized, int8_matmul_tiles, launch_blocks, round_half_away,
)


# ============================================================================================================
# Q8_0 (exercise 1)
# ============================================================================================================
@triton.jit
def _round_half_even(v):
    f = tl.floor(v)
    diff = v - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(diff > 0.5, f + 1.0, tl.where(diff < 0.5, f, tl.where(odd, f + 1.0, f)))


@triton.jit
def _q8_quant_kernel(x_ptr, data_ptr, scale_ptr, n, n_blocks,
                     SCALE_FP32: tl.constexpr, TRUNC: tl.constexpr, EVEN: tl.constexpr,
                     BLOCK_LEVEL_MASK: tl.constexpr, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    cols = tl.arange(0, 32)
    offs = rb[:, None] * 32 + cols[None, :]
    if BLOCK_LEVEL_MASK:
        lmask = (rb < n_blocks)[:, None] & (cols[None, :] < 32)
    else:
        lmask = offs < n
    x = tl.load(x_ptr + offs, mask=lmask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    d32 = amax / 127.0
    d16 = d32.to(tl.float16)
    if SCALE_FP32:
        dq = d32
    else:
        dq = d16.to(tl.float32)
    nz = dq != 0.0
    safe = tl.where(nz, dq, 1.0)
    v = x / safe[:, None]
    if TRUNC:
        q = v.to(tl.int32).to(tl.float32)
    elif EVEN:
        q = _round_half_even(v)
    else:
        q = round_half_away(v)
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    q = tl.where(nz[:, None], q, 0.0)
    bmask = rb < n_blocks
    tl.store(data_ptr + offs, q.to(tl.int32).to(tl.int8), mask=bmask[:, None] & (cols[None, :] < 32))
    tl.store(scale_ptr + rb, d16, mask=bmask)


@triton.jit
def _q8_dequant_kernel(data_ptr, scale_ptr, out_ptr, n, n_blocks, FP16_MUL: tl.constexpr,
                       BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    cols = tl.arange(0, 32)
    offs = rb[:, None] * 32 + cols[None, :]
    bmask = rb < n_blocks
    if FP16_MUL:
        q = tl.load(data_ptr + offs, mask=bmask[:, None] & (cols[None, :] < 32), other=0).to(tl.float16)
        d = tl.load(scale_ptr + rb, mask=bmask, other=0.0)
        y = q * d[:, None]
    else:
        q = tl.load(data_ptr + offs, mask=bmask[:, None] & (cols[None, :] < 32), other=0).to(tl.float32)
        d = tl.load(scale_ptr + rb, mask=bmask, other=0.0).to(tl.float32)
        y = q * d[:, None]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=offs < n)


def _q8_quantize(w, scale_fp32=False, trunc=False, even=False, block_mask=False, contiguous=True, check=True):
    if check:
        check_float_tensor(w, "w")
    x = w.contiguous() if contiguous else w
    qt = empty_quantized(w, "q8_0")
    blocks = qt.scales.numel()
    launch_blocks(_q8_quant_kernel, blocks, x, qt.data, qt.scales, w.numel(), blocks,
                  scale_fp32, trunc, even, block_mask)
    return qt


def _q8_dequantize(qt, out_dtype=None, fp16_mul=False, check=True):
    if check:
        check_quantized(qt, "q8_0")
    out = torch.empty(qt.shape, dtype=out_dtype or qt.dtype, device=qt.data.device)
    blocks = qt.scales.numel()
    launch_blocks(_q8_dequant_kernel, blocks, qt.data, qt.scales, out, qt.numel, blocks, fp16_mul)
    return out


# ---- correct (used as the base of the others; not listed: the "obvious" implementation)
def quantize_q8_0_plain(w: torch.Tensor) -> Quantized:
    """w (any shape; fp32, fp16 or bf16) in Q8_0."""
    return _q8_quantize(w)


def dequantize_q8_0_plain(qt: Quantized) -> torch.Tensor:
    """The tensor a Q8_0 Quantized stands for, in its original shape and dtype."""
    return _q8_dequantize(qt)


# ---- wrong
def quantize_q8_0_fp32_scale_codes(w: torch.Tensor) -> Quantized:
    """Codes from the fp32 scale (llama.cpp's own order), stored scale fp16."""
    return _q8_quantize(w, scale_fp32=True)


def quantize_q8_0_truncate(w: torch.Tensor) -> Quantized:
    """Codes by casting x / d to int (truncation toward zero)."""
    return _q8_quantize(w, trunc=True)


def quantize_q8_0_half_even(w: torch.Tensor) -> Quantized:
    """Rounds halves to even (rint) instead of away from zero."""
    return _q8_quantize(w, even=True)


def quantize_q8_0_tail_unmasked(w: torch.Tensor) -> Quantized:
    """Loads whole blocks (mask by block index only): reads past n in the last block."""
    return _q8_quantize(w, block_mask=True)


def quantize_q8_0_strided_input(w: torch.Tensor) -> Quantized:
    """Hands w's pointer to the kernel without making it contiguous."""
    return _q8_quantize(w, contiguous=False)


def quantize_q8_0_torch_scales(w: torch.Tensor) -> Quantized:
    """Computes the scales in PyTorch and only the codes in the kernel... then the kernel recomputes them anyway."""
    check_float_tensor(w, "w")
    n = w.numel()
    blocks = triton.cdiv(n, QK)
    flat = F.pad(w.reshape(-1).float(), (0, blocks * QK - n)).view(blocks, QK)
    scales = (flat.abs().amax(dim=1) / 127).half()
    qt = _q8_quantize(w)
    qt.scales.copy_(scales)
    return qt


def dequantize_q8_0_fp32_out(qt: Quantized) -> torch.Tensor:
    """Returns fp32 whatever qt.dtype is."""
    return _q8_dequantize(qt, out_dtype=torch.float32)


def dequantize_q8_0_fp16_multiply(qt: Quantized) -> torch.Tensor:
    """Multiplies q · d in fp16 (the scale's dtype), then converts to the output dtype: x̂ rounded twice."""
    return _q8_dequantize(qt, fp16_mul=True)


def dequantize_q8_0_no_check(qt: Quantized) -> torch.Tensor:
    """Skips check_quantized: a Q4_0 tensor (or a corrupt one) is dequantized as garbage."""
    return _q8_dequantize(qt, check=False)


# ---- right alternative: another BLOCKS (own grid), a flat 1-D tile reshaped to [BLOCKS, 32]
@triton.jit
def _q8_quant_flat_kernel(x_ptr, data_ptr, scale_ptr, n, n_blocks, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCKS * 32 + tl.arange(0, BLOCKS * 32)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    x2 = tl.reshape(x, (BLOCKS, 32))
    d = (tl.max(tl.abs(x2), axis=1) / 127.0).to(tl.float16)
    df = d.to(tl.float32)
    q = round_half_away(x2 / tl.where(df == 0.0, 1.0, df)[:, None])
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    q = tl.reshape(q, (BLOCKS * 32,))
    tl.store(data_ptr + offs, q.to(tl.int8), mask=offs < n_blocks * 32)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    tl.store(scale_ptr + rb, d, mask=rb < n_blocks)


@triton.jit
def _q8_dequant_flat_kernel(data_ptr, scale_ptr, out_ptr, n, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCKS * 32 + tl.arange(0, BLOCKS * 32)
    q = tl.load(data_ptr + offs, mask=offs < n, other=0).to(tl.float32)
    d = tl.load(scale_ptr + offs // 32, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (q * d).to(out_ptr.dtype.element_ty), mask=offs < n)


def quantize_q8_0_flat_tile(w: torch.Tensor) -> Quantized:
    """w (any shape; fp32, fp16 or bf16) in Q8_0."""
    check_float_tensor(w, "w")
    x = w.contiguous()
    qt = empty_quantized(w, "q8_0")
    blocks = qt.scales.numel()
    if blocks:
        _q8_quant_flat_kernel[(triton.cdiv(blocks, 8),)](x, qt.data, qt.scales, x.numel(), blocks, BLOCKS=8)
    return qt


def dequantize_q8_0_flat_tile(qt: Quantized) -> torch.Tensor:
    """The tensor a Q8_0 Quantized stands for, in its original shape and dtype."""
    check_quantized(qt, "q8_0")
    out = torch.empty(qt.shape, dtype=qt.dtype, device=qt.data.device)
    n = qt.numel
    if n:
        _q8_dequant_flat_kernel[(triton.cdiv(n, 8 * 32),)](qt.data, qt.scales, out, n, BLOCKS=8)
    return out


# ============================================================================================================
# Q4_0 (exercise 2)
# ============================================================================================================
@triton.jit
def _q4_quant_kernel(x_ptr, data_ptr, scale_ptr, n, n_blocks,
                     ABS_SCALE: tl.constexpr, NO_CLAMP: tl.constexpr, ADJACENT: tl.constexpr,
                     ZERO_CODE: tl.constexpr, SWAP: tl.constexpr, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    c = tl.arange(0, 16)
    base = rb[:, None] * 32
    if ADJACENT:
        off_lo = base + 2 * c[None, :]
        off_hi = off_lo + 1
    else:
        off_lo = base + c[None, :]
        off_hi = off_lo + 16
    lo = tl.load(x_ptr + off_lo, mask=off_lo < n, other=0.0).to(tl.float32)
    hi = tl.load(x_ptr + off_hi, mask=off_hi < n, other=0.0).to(tl.float32)
    mx = tl.maximum(tl.max(lo, axis=1), tl.max(hi, axis=1))
    mn = tl.minimum(tl.min(lo, axis=1), tl.min(hi, axis=1))
    if ABS_SCALE:
        m = tl.maximum(mx, -mn)
    else:
        m = tl.where(mx >= -mn, mx, mn)
    d = (m / -8.0).to(tl.float16)
    df = d.to(tl.float32)
    nz = df != 0.0
    safe = tl.where(nz, df, 1.0)
    qlo = tl.floor(lo / safe[:, None] + 8.5)
    qhi = tl.floor(hi / safe[:, None] + 8.5)
    if not NO_CLAMP:
        qlo = tl.minimum(tl.maximum(qlo, 0.0), 15.0)
        qhi = tl.minimum(tl.maximum(qhi, 0.0), 15.0)
    qlo = tl.where(nz[:, None], qlo, ZERO_CODE).to(tl.int32)
    qhi = tl.where(nz[:, None], qhi, ZERO_CODE).to(tl.int32)
    if SWAP:
        byte = (qhi & 15) | ((qlo & 15) << 4)
    else:
        byte = (qlo & 15) | ((qhi & 15) << 4)
    bmask = rb < n_blocks
    tl.store(data_ptr + rb[:, None] * 16 + c[None, :], byte.to(tl.uint8), mask=bmask[:, None] & (c[None, :] < 16))
    tl.store(scale_ptr + rb, d, mask=bmask)


@triton.jit
def _q4_dequant_kernel(data_ptr, scale_ptr, out_ptr, n, n_blocks, ADJACENT: tl.constexpr, FORGET_8: tl.constexpr,
                       SWAP: tl.constexpr, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    c = tl.arange(0, 16)
    bmask = rb < n_blocks
    b = tl.load(data_ptr + rb[:, None] * 16 + c[None, :], mask=bmask[:, None] & (c[None, :] < 16), other=0)
    b = b.to(tl.int32)
    if SWAP:
        qlo = (b >> 4) & 15
        qhi = b & 15
    else:
        qlo = b & 15
        qhi = (b >> 4) & 15
    d = tl.load(scale_ptr + rb, mask=bmask, other=0.0).to(tl.float32)
    if FORGET_8:
        ylo = qlo.to(tl.float32) * d[:, None]
        yhi = qhi.to(tl.float32) * d[:, None]
    else:
        ylo = (qlo - 8).to(tl.float32) * d[:, None]
        yhi = (qhi - 8).to(tl.float32) * d[:, None]
    base = rb[:, None] * 32
    if ADJACENT:
        off_lo = base + 2 * c[None, :]
        off_hi = off_lo + 1
    else:
        off_lo = base + c[None, :]
        off_hi = off_lo + 16
    tl.store(out_ptr + off_lo, ylo.to(out_ptr.dtype.element_ty), mask=off_lo < n)
    tl.store(out_ptr + off_hi, yhi.to(out_ptr.dtype.element_ty), mask=off_hi < n)


def _q4_quantize(w, abs_scale=False, no_clamp=False, adjacent=False, zero_code=8.0, swap=False):
    check_float_tensor(w, "w")
    x = w.contiguous()
    qt = empty_quantized(w, "q4_0")
    blocks = qt.scales.numel()
    launch_blocks(_q4_quant_kernel, blocks, x, qt.data, qt.scales, w.numel(), blocks,
                  abs_scale, no_clamp, adjacent, zero_code, swap)
    return qt


def _q4_dequantize(qt, adjacent=False, forget_8=False, swap=False):
    check_quantized(qt, "q4_0")
    out = torch.empty(qt.shape, dtype=qt.dtype, device=qt.data.device)
    blocks = qt.scales.numel()
    launch_blocks(_q4_dequant_kernel, blocks, qt.data, qt.scales, out, qt.numel, blocks, adjacent, forget_8, swap)
    return out


def quantize_q4_0_plain(w: torch.Tensor) -> Quantized:
    """w (any shape; fp32, fp16 or bf16) in Q4_0."""
    return _q4_quantize(w)


def dequantize_q4_0_plain(qt: Quantized) -> torch.Tensor:
    """The tensor a Q4_0 Quantized stands for, in its original shape and dtype."""
    return _q4_dequantize(qt)


# ---- wrong
def quantize_q4_0_unsigned_scale(w: torch.Tensor) -> Quantized:
    """d = absmax / -8 (the magnitude, its sign dropped): round trip still within |d|, scale has the wrong sign."""
    return _q4_quantize(w, abs_scale=True)


def quantize_q4_0_no_clamp15(w: torch.Tensor) -> Quantized:
    """Forgets min(15, .): an opposite-sign value near |m| gets code 16, which wraps to 0 in the nibble."""
    return _q4_quantize(w, no_clamp=True)


def quantize_q4_0_adjacent_pairs(w: torch.Tensor) -> Quantized:
    """Packs values 2j and 2j+1 into byte j (the intuitive layout, not llama.cpp's j / j+16)."""
    return _q4_quantize(w, adjacent=True)


def dequantize_q4_0_adjacent_pairs(qt: Quantized) -> torch.Tensor:
    """Unpacks values 2j and 2j+1 from byte j: consistent with its own quantizer, not with the format."""
    return _q4_dequantize(qt, adjacent=True)


def quantize_q4_0_zero_block_code0(w: torch.Tensor) -> Quantized:
    """A block of zeros gets codes 0 (not 8): x̂ = (0 − 8) · 0 = 0 still."""
    return _q4_quantize(w, zero_code=0.0)


def quantize_q4_0_nibbles_swapped(w: torch.Tensor) -> Quantized:
    """Value j in the HIGH nibble, value j+16 in the low one."""
    return _q4_quantize(w, swap=True)


def dequantize_q4_0_nibbles_swapped(qt: Quantized) -> torch.Tensor:
    """Reads value j from the high nibble (matches its own quantizer only)."""
    return _q4_dequantize(qt, swap=True)


def dequantize_q4_0_forget_offset(qt: Quantized) -> torch.Tensor:
    """x̂ = q · d: forgets the − 8."""
    return _q4_dequantize(qt, forget_8=True)


# ---- right alternative: one [BLOCKS, 32] tile split into its halves with reshape/permute/split, BLOCKS=8
@triton.jit
def _q4_quant_split_kernel(x_ptr, data_ptr, scale_ptr, n, n_blocks, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    cols = tl.arange(0, 32)
    offs = rb[:, None] * 32 + cols[None, :]
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    mx = tl.max(x, axis=1)
    mn = tl.min(x, axis=1)
    m = tl.where(mx >= -mn, mx, mn)
    d = (m / -8.0).to(tl.float16)
    df = d.to(tl.float32)
    nz = df != 0.0
    q = tl.floor(x / tl.where(nz, df, 1.0)[:, None] + 8.5)
    q = tl.minimum(tl.maximum(q, 0.0), 15.0)
    q = tl.where(nz[:, None], q, 8.0).to(tl.int32)
    q3 = tl.permute(tl.reshape(q, (BLOCKS, 2, 16)), (0, 2, 1))
    lo, hi = tl.split(q3)
    byte = lo | (hi << 4)
    c = tl.arange(0, 16)
    tl.store(data_ptr + rb[:, None] * 16 + c[None, :], byte.to(tl.uint8), mask=(rb < n_blocks)[:, None])
    tl.store(scale_ptr + rb, d, mask=rb < n_blocks)


@triton.jit
def _q4_dequant_join_kernel(data_ptr, scale_ptr, out_ptr, n, n_blocks, BLOCKS: tl.constexpr):
    pid = tl.program_id(0)
    rb = pid * BLOCKS + tl.arange(0, BLOCKS)
    c = tl.arange(0, 16)
    b = tl.load(data_ptr + rb[:, None] * 16 + c[None, :], mask=(rb < n_blocks)[:, None], other=0).to(tl.int32)
    q = tl.join(b & 15, b >> 4)  # [BLOCKS, 16, 2]
    q = tl.reshape(tl.permute(q, (0, 2, 1)), (BLOCKS, 32))
    d = tl.load(scale_ptr + rb, mask=rb < n_blocks, other=0.0).to(tl.float32)
    y = (q - 8).to(tl.float32) * d[:, None]
    cols = tl.arange(0, 32)
    offs = rb[:, None] * 32 + cols[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=offs < n)


def quantize_q4_0_split_halves(w: torch.Tensor) -> Quantized:
    """w (any shape; fp32, fp16 or bf16) in Q4_0."""
    check_float_tensor(w, "w")
    x = w.contiguous()
    qt = empty_quantized(w, "q4_0")
    blocks = qt.scales.numel()
    if blocks:
        _q4_quant_split_kernel[(triton.cdiv(blocks, 8),)](x, qt.data, qt.scales, x.numel(), blocks, BLOCKS=8)
    return qt


def dequantize_q4_0_join_halves(qt: Quantized) -> torch.Tensor:
    """The tensor a Q4_0 Quantized stands for, in its original shape and dtype."""
    check_quantized(qt, "q4_0")
    out = torch.empty(qt.shape, dtype=qt.dtype, device=qt.data.device)
    blocks = qt.scales.numel()
    if blocks:
        _q4_dequant_join_kernel[(triton.cdiv(blocks, 8),)](qt.data, qt.scales, out, qt.numel, blocks, BLOCKS=8)
    return out


# ============================================================================================================
# Weight-only int8 matmul (exercise 3)
# ============================================================================================================
@triton.jit
def _int8_mm_kernel(x_ptr, data_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                    NO_KMASK: tl.constexpr, PER_CODE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    kb = K // 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        if NO_KMASK:
            kmask = rk >= 0
        else:
            kmask = rk < K
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        codes = tl.load(data_ptr + rn[None, :] * K + rk[:, None], mask=kmask[:, None] & nmask[None, :], other=0)
        if PER_CODE:
            s = tl.load(scale_ptr + rn[None, :] * kb + rk[:, None] // 32, mask=kmask[:, None] & nmask[None, :],
                        other=0.0).to(tl.float32)
            w = codes.to(tl.float32) * s
        else:
            rs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            if NO_KMASK:
                smask = nmask[None, :] & (rs >= 0)[:, None]
            else:
                smask = (rs < kb)[:, None] & nmask[None, :]
            s = tl.load(scale_ptr + rn[None, :] * kb + rs[:, None], mask=smask, other=0.0).to(tl.float32)
            w3 = tl.reshape(codes.to(tl.float32), (BLOCK_K // 32, 32, BLOCK_N)) * s[:, None, :]
            w = tl.reshape(w3, (BLOCK_K, BLOCK_N))
        w = w.to(x_ptr.dtype.element_ty)
        if IEEE:
            acc = tl.dot(xt, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, w, acc)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


def _int8_mm(x, qw, *, check=True, no_kmask=False, per_code=False, tiles=None, ieee=None, out_dtype=None,
             stride_is_k=False, m_first_dim=False):
    if check:
        check_int8_matmul_inputs(x, qw)
    n, k = qw.shape
    if m_first_dim:
        x2 = x.contiguous()
        m = x.shape[0]
    elif stride_is_k:
        x2 = x.reshape(-1, k) if x.dim() != 2 else x
        m = x2.shape[0]
    else:
        x2 = x.reshape(-1, k)
        if x2.numel() and x2.stride(-1) != 1:
            x2 = x2.contiguous()
        m = x2.shape[0]
    y = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m and n:
        cfg = dict(tiles or int8_matmul_tiles(m))
        bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
        use_ieee = (x.dtype == torch.float32) if ieee is None else ieee
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
        stride_xm = k if stride_is_k else x2.stride(0)
        _int8_mm_kernel[grid](x2, qw.data, qw.scales, y, m, n, k, stride_xm, y.stride(0), no_kmask, per_code,
                              BLOCK_M=bm, BLOCK_N=bn, IEEE=use_ieee, **cfg)
    if m_first_dim:
        return y
    return y.reshape(*x.shape[:-1], n)


def int8_weight_matmul_plain(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """x @ Ŵᵀ for a Q8_0 weight of shape (N, K): y of shape (..., N) in x's dtype."""
    return _int8_mm(x, qw)


# ---- wrong
def int8_weight_matmul_no_kmask(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Masks M and N but not K: right when BLOCK_K divides K, reads the next row's codes otherwise."""
    return _int8_mm(x, qw, no_kmask=True)


def int8_weight_matmul_tf32(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Forgets input_precision="ieee" in fp32 (Triton's default TF32 on a GPU)."""
    return _int8_mm(x, qw, ieee=False)


def int8_weight_matmul_fp32_out(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Returns the fp32 accumulator's dtype instead of x's."""
    return _int8_mm(x, qw, out_dtype=torch.float32)


def int8_weight_matmul_stride_assumed_k(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Passes K as x's row stride and never makes x contiguous: wrong for a column slice of a wider tensor."""
    return _int8_mm(x, qw, stride_is_k=True)


def int8_weight_matmul_2d_only(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Takes M = x.shape[0]: a (B, T, K) input is treated as B rows and returns (B, N)."""
    return _int8_mm(x, qw, m_first_dim=True)


def int8_weight_matmul_no_shape_check(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Validates x's dtype and the format, but not K against x nor K % 32."""
    check_float_tensor(x, "x")
    check_quantized(qw, "q8_0")
    if x.device != qw.data.device:
        raise ValueError("one device, please")
    n, k = qw.shape
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m and n:
        cfg = dict(int8_matmul_tiles(m))
        bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
        _int8_mm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            x2, qw.data, qw.scales, y, m, n, k, x2.stride(0), y.stride(0), False, False,
            BLOCK_M=bm, BLOCK_N=bn, IEEE=x.dtype == torch.float32, **cfg)
    return y.reshape(*x.shape[:-1], n)


def int8_weight_matmul_dequant_then_mm(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Dequantizes the whole weight (a tensor the size of Ŵ), then x @ Ŵᵀ."""
    check_int8_matmul_inputs(x, qw)
    w_hat = _q8_dequantize(qw, out_dtype=x.dtype)
    return x @ w_hat.T


def int8_weight_matmul_expanded_scales(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Expands the scales to one per code in PyTorch first (N*K fp32: bigger than Ŵ), then the kernel."""
    check_int8_matmul_inputs(x, qw)
    full = qw.scales.float().repeat_interleave(QK)  # one scale per code, (N*K,)
    q2 = Quantized("q8_0", qw.data, qw.scales, qw.shape, qw.dtype)
    y = _int8_mm(x, q2, per_code=True)
    del full
    return y


def int8_weight_matmul_keeps_scale_cache(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Caches a dequantized copy of the weight in a global 'to be faster next time' (stays alive)."""
    check_int8_matmul_inputs(x, qw)
    hit = _W_CACHE.get((qw.data.data_ptr(), x.dtype))
    if hit is not None and hit[0] is qw.data and hit[1] is qw.scales:
        w_hat = hit[2]
    else:
        w_hat = _q8_dequantize(qw, out_dtype=x.dtype)
        _W_CACHE[(qw.data.data_ptr(), x.dtype)] = (qw.data, qw.scales, w_hat)  # keeps them alive: no stale hit
    return x @ w_hat.T


_W_CACHE: dict = {}


# ---- right alternatives
def int8_weight_matmul_per_code_scales(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Loads one scale per code (the text: correct, slower on a GPU) with its own tiles (BLOCK_K = 32)."""
    return _int8_mm(x, qw, per_code=True, tiles=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=4))


def int8_weight_matmul_wide_k(x: torch.Tensor, qw: Quantized) -> torch.Tensor:
    """Compact scales, own tiles: BLOCK_N 64, BLOCK_K 128 (ragged K for K = 32, 96, ...)."""
    m = x.reshape(-1, x.shape[-1]).shape[0] if x.dim() else 0
    bm = 16 if m <= 16 else 32
    return _int8_mm(x, qw, tiles=dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, num_warps=4))


# ============================================================================================================
# Blockwise dynamic quantization (exercise 4)
# ============================================================================================================
def _blocks_of(x, block):
    flat = x.reshape(-1).float()
    n = flat.numel()
    nb = triton.cdiv(n, block)
    return F.pad(flat, (0, nb * block - n)).view(nb, block), n


def quantize_blockwise_plain(x: torch.Tensor, code: torch.Tensor, block: int = STATE_BLOCK):
    """(codes uint8 of x.numel(), absmax fp32 of ceil(n / block))."""
    xb, n = _blocks_of(x, block)
    absmax = xb.abs().amax(dim=1)
    normed = xb / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]
    mids = (code[1:] + code[:-1]) / 2
    codes = torch.bucketize(normed, mids).view(-1)[:n].to(torch.uint8)
    return codes, absmax


def dequantize_blockwise_plain(codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                               block: int = STATE_BLOCK) -> torch.Tensor:
    """fp32 values code[codes] * absmax of their block, flattened."""
    flat = codes.reshape(-1)
    n = flat.numel()
    vals = code[flat.long()].float()
    idx = torch.arange(n, device=flat.device) // block
    return vals * absmax[idx]


# ---- wrong
def quantize_blockwise_round_up(x: torch.Tensor, code: torch.Tensor, block: int = STATE_BLOCK):
    """bucketize against the levels themselves (not the midpoints): picks the level at or above, not the nearest."""
    xb, n = _blocks_of(x, block)
    absmax = xb.abs().amax(dim=1)
    normed = xb / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]
    codes = torch.bucketize(normed, code).clamp_max(code.numel() - 1).view(-1)[:n].to(torch.uint8)
    return codes, absmax


def quantize_blockwise_fixed_block(x: torch.Tensor, code: torch.Tensor, block: int = STATE_BLOCK):
    """Ignores the `block` argument: always STATE_BLOCK."""
    return quantize_blockwise_plain(x, code, STATE_BLOCK)


def dequantize_blockwise_fixed_block(codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                                     block: int = STATE_BLOCK) -> torch.Tensor:
    """Ignores the `block` argument: always STATE_BLOCK."""
    return dequantize_blockwise_plain(codes, absmax, code, STATE_BLOCK)


def quantize_blockwise_input_dtype_absmax(x: torch.Tensor, code: torch.Tensor, block: int = STATE_BLOCK):
    """absmax in x's dtype (fp16/bf16 stays fp16/bf16), normalization in that dtype too."""
    flat = x.reshape(-1)
    n = flat.numel()
    nb = triton.cdiv(n, block)
    xb = F.pad(flat, (0, nb * block - n)).view(nb, block)
    absmax = xb.abs().amax(dim=1)
    normed = xb / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]
    mids = ((code[1:] + code[:-1]) / 2).to(x.dtype)
    codes = torch.bucketize(normed, mids).view(-1)[:n].to(torch.uint8)
    return codes, absmax


def quantize_blockwise_nan_zero_block(x: torch.Tensor, code: torch.Tensor, block: int = STATE_BLOCK):
    """Divides by absmax unguarded: a zero block is 0/0 = NaN, bucketize puts NaN on the last level (1.0)."""
    xb, n = _blocks_of(x, block)
    absmax = xb.abs().amax(dim=1)
    normed = xb / absmax[:, None]
    mids = (code[1:] + code[:-1]) / 2
    codes = torch.bucketize(normed, mids).view(-1)[:n].to(torch.uint8)
    return codes, absmax


def dequantize_blockwise_keeps_padding(codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                                       block: int = STATE_BLOCK) -> torch.Tensor:
    """Reshapes to (blocks, block) with padding and forgets to cut it: returns ceil(n/block)*block values."""
    flat = codes.reshape(-1).long()
    n = flat.numel()
    nb = absmax.numel()
    padded = F.pad(flat, (0, nb * block - n), value=int(torch.argmin(code.abs())))
    return (code[padded].view(nb, block) * absmax[:, None]).reshape(-1)


# ---- right alternative: nearest level by searchsorted and a comparison of the two neighbours
def quantize_blockwise_neighbours(x: torch.Tensor, code: torch.Tensor, block: int = STATE_BLOCK):
    """(codes uint8 of x.numel(), absmax fp32 of ceil(n / block))."""
    flat = x.reshape(-1).float()
    n = flat.numel()
    nb = triton.cdiv(n, block)
    absmax = torch.zeros(nb, dtype=torch.float32, device=x.device)
    if nb:
        full = n // block
        if full:
            absmax[:full] = flat[:full * block].view(full, block).abs().amax(dim=1)
        if n > full * block:
            absmax[full] = flat[full * block:].abs().amax()
    scale = absmax.repeat_interleave(block)[:n]
    scale[scale == 0] = 1.0  # a zero block: 0 / 1 = 0, the zero level
    normed = flat / scale
    del scale
    hi = torch.searchsorted(code, normed, out_int32=True).clamp_(1, code.numel() - 1)
    lo = hi - 1
    lo += (code[hi] - normed) < (normed - code[lo])  # the upper neighbour when strictly nearer
    return lo.to(torch.uint8), absmax


def dequantize_blockwise_repeat(codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                                block: int = STATE_BLOCK) -> torch.Tensor:
    """fp32 values code[codes] * absmax of their block, flattened."""
    flat = codes.reshape(-1)
    n = flat.numel()
    return code.float()[flat.to(torch.int64)] * absmax.float().repeat_interleave(block)[:n]


# ============================================================================================================
# AdamW8bit (exercise 5): the given __init__ and _state, copied from the notebook; step varies
# ============================================================================================================
class _AdamW8bitGiven(torch.optim.Optimizer):
    """AdamW with m and v stored in 8 bits: blockwise (STATE_BLOCK values per fp32 absmax) on the dynamic code.
    The update runs in fp32, `chunk` values at a time."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, min_8bit_size=4096,
                 chunk=1 << 22):
        if lr < 0 or eps <= 0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0:
            raise ValueError(f"invalid AdamW8bit hyperparameters: lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        if chunk <= 0 or chunk % STATE_BLOCK:
            raise ValueError(f"chunk={chunk} should be a positive multiple of the block ({STATE_BLOCK})")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      min_8bit_size=min_8bit_size, chunk=chunk))
        self.codes = {"m": dynamic_code(signed=True), "v": dynamic_code(signed=False)}

    def _state(self, p, group) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = 0
            if p.numel() >= group["min_8bit_size"]:
                blocks = triton.cdiv(p.numel(), STATE_BLOCK)
                for name in ("m", "v"):
                    state[name] = torch.zeros(p.numel(), dtype=torch.uint8, device=p.device)
                    state[name + "_absmax"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
            else:
                state["m"] = torch.zeros_like(p, dtype=torch.float32)
                state["v"] = torch.zeros_like(p, dtype=torch.float32)
        for name in ("m", "v"):
            if self.codes[name].device != p.device:
                self.codes[name] = self.codes[name].to(p.device)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, chunk = group["lr"], group["betas"], group["eps"], group["chunk"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, group)
                state["step"] += 1
                self._update(p, state, group, lr, beta1, beta2, eps, chunk)
        return loss

    # knobs the mutants turn
    v_code = "v"
    bias_correction = True
    decay_where = "before"  # "before" | "l2" | "none_fp32"
    requantized_update = False
    whole_tensor = False
    absmax_chunk_index = False
    clobber_grad = False
    no_sqrt = False
    eps_inside = False
    folded_step = False

    def _direction(self, m, v, bc1, bc2, eps):
        if self.no_sqrt:
            return (m / bc1) / (v / bc2 + eps)
        if self.eps_inside:
            return (m / bc1) / torch.sqrt(v / bc2 + eps)
        if self.folded_step:  # torch's arrangement: step size lr / bc1, denominator sqrt(v) / sqrt(bc2) + eps
            return m.div(torch.sqrt(v).div_(math.sqrt(bc2)).add_(eps)).div_(bc1)
        return (m / bc1) / (torch.sqrt(v / bc2) + eps)

    def _update(self, p, state, group, lr, beta1, beta2, eps, chunk):
        t = state["step"]
        bc1 = 1 - beta1 ** t if self.bias_correction else 1.0
        bc2 = 1 - beta2 ** t if self.bias_correction else 1.0
        wd = group["weight_decay"]
        g_all = p.grad
        if self.decay_where == "l2":
            g_all = g_all + wd * p
        eightbit = "m_absmax" in state
        if self.decay_where == "before" or (self.decay_where == "none_fp32" and eightbit):
            p.mul_(1 - lr * wd)
        if not eightbit:
            m, v = state["m"], state["v"]
            g = g_all.float()
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.add_(self._direction(m, v, bc1, bc2, eps).to(p.dtype), alpha=-lr)
            return
        n = p.numel()
        pf = p.view(-1)
        gf = g_all.reshape(-1)
        cm, cv = self.codes["m"], self.codes[self.v_code]
        step = n if self.whole_tensor else chunk
        for s in range(0, n, step):
            e = min(s + step, n)
            b0, b1 = s // STATE_BLOCK, triton.cdiv(e, STATE_BLOCK)
            if self.absmax_chunk_index:
                b0 = s // chunk
                b1 = b0 + triton.cdiv(e - s, STATE_BLOCK)
            m = dequantize_blockwise_plain(state["m"][s:e], state["m_absmax"][b0:b1], cm)
            v = dequantize_blockwise_plain(state["v"][s:e], state["v_absmax"][b0:b1], cv)
            g = gf[s:e].float()
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            if self.clobber_grad:
                v.mul_(beta2).add_(g.mul_(g), alpha=1 - beta2)
            else:
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            mc, ma = quantize_blockwise_plain(m, cm)
            vc, va = quantize_blockwise_plain(v, cv)
            if self.requantized_update:
                m = dequantize_blockwise_plain(mc, ma, cm)
                v = dequantize_blockwise_plain(vc, va, cv)
            pf[s:e].add_(self._direction(m, v, bc1, bc2, eps).to(p.dtype), alpha=-lr)
            state["m"][s:e] = mc
            state["m_absmax"][b0:b1] = ma
            state["v"][s:e] = vc
            state["v_absmax"][b0:b1] = va


class AdamW8bit_plain(_AdamW8bitGiven):
    """The obvious correct step."""


# ---- wrong
class AdamW8bit_no_bias_correction(_AdamW8bitGiven):
    """Forgets the 1 − βᵗ terms."""
    bias_correction = False


class AdamW8bit_l2_decay(_AdamW8bitGiven):
    """Adds wd · p to the gradient (Adam + L2) instead of decoupled p ← p · (1 − lr · wd)."""
    decay_where = "l2"


class AdamW8bit_fp32_path_no_decay(_AdamW8bitGiven):
    """Weight decay only on the 8-bit path: the small fp32-state parameters never decay."""
    decay_where = "none_fp32"


class AdamW8bit_requantized_update(_AdamW8bitGiven):
    """Quantizes m and v back first and updates p with the rounded values, not 'these fp32 values'."""
    requantized_update = True


class AdamW8bit_whole_tensor(_AdamW8bitGiven):
    """Ignores `chunk`: dequantizes all of m and v to fp32 at once (8 bytes per parameter of scratch)."""
    whole_tensor = True


class AdamW8bit_absmax_chunk_index(_AdamW8bitGiven):
    """Indexes a chunk's absmax from s // chunk instead of s // STATE_BLOCK: right only for the first chunk."""
    absmax_chunk_index = True


class AdamW8bit_signed_code_for_v(_AdamW8bitGiven):
    """Quantizes v on the signed code (half its levels wasted on negatives; _state gives the unsigned one)."""
    v_code = "m"


class AdamW8bit_grad_overwritten(_AdamW8bitGiven):
    """Squares the gradient in place for v (g.mul_(g)): p is right, p.grad is left holding g²."""
    clobber_grad = True


class AdamW8bit_no_sqrt(_AdamW8bitGiven):
    """Divides by v̂ + ε instead of √v̂ + ε."""
    no_sqrt = True


class AdamW8bit_eps_inside_sqrt(_AdamW8bitGiven):
    """√(v̂ + ε) instead of √v̂ + ε."""
    eps_inside = True


# ---- right alternatives
class AdamW8bit_folded_bias_correction(_AdamW8bitGiven):
    """torch.optim.AdamW's arrangement of the same formula: (m / (√v / √(1−β₂ᵗ) + ε)) / (1−β₁ᵗ)."""
    folded_step = True


class AdamW8bit_block_loop(_AdamW8bitGiven):
    """Another loop: m and v rebuilt with my own neighbour quantizer; the fp32 path with torch's addcdiv."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, chunk = group["lr"], group["betas"], group["eps"], group["chunk"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, group)
                state["step"] += 1
                t = state["step"]
                bc1, bc2 = 1 - beta1 ** t, 1 - beta2 ** t
                p.mul_(1 - lr * group["weight_decay"])
                if "m_absmax" not in state:
                    m, v = state["m"], state["v"]
                    g = p.grad.float()
                    m.lerp_(g, 1 - beta1)
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = (v / bc2).sqrt_().add_(eps)
                    p.addcdiv_(m / bc1, denom, value=-lr)
                    continue
                pf, gf = p.view(-1), p.grad.reshape(-1)
                n = p.numel()
                for s in range(0, n, chunk):
                    e = min(s + chunk, n)
                    sl, bl = slice(s, e), slice(s // STATE_BLOCK, triton.cdiv(e, STATE_BLOCK))
                    g = gf[sl].to(torch.float32)
                    m = dequantize_blockwise_repeat(state["m"][sl], state["m_absmax"][bl], self.codes["m"])
                    v = dequantize_blockwise_repeat(state["v"][sl], state["v_absmax"][bl], self.codes["v"])
                    m.lerp_(g, 1 - beta1)
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    upd = (m / bc1).div_((v / bc2).sqrt_().add_(eps))
                    pf[sl].add_(upd, alpha=-lr)
                    state["m"][sl], state["m_absmax"][bl] = quantize_blockwise_neighbours(m, self.codes["m"])
                    state["v"][sl], state["v_absmax"][bl] = quantize_blockwise_neighbours(v, self.codes["v"])
        return loss


# ============================================================================================================
def _q8(q, d):
    return {"quantize_q8_0": q, "dequantize_q8_0": d}


def _q4(q, d):
    return {"quantize_q4_0": q, "dequantize_q4_0": d}


def _bw(q, d):
    return {"quantize_blockwise": q, "dequantize_blockwise": d}


BLIND = {
    "q8_0": {
        "wrong": [
            _q8("quantize_q8_0_fp32_scale_codes", "ref"),
            _q8("quantize_q8_0_truncate", "ref"),
            _q8("quantize_q8_0_half_even", "ref"),
            _q8("quantize_q8_0_tail_unmasked", "ref"),
            _q8("quantize_q8_0_strided_input", "ref"),
            _q8("quantize_q8_0_torch_scales", "ref"),
            _q8("ref", "dequantize_q8_0_fp32_out"),
            _q8("ref", "dequantize_q8_0_fp16_multiply"),
            _q8("ref", "dequantize_q8_0_no_check"),
            # moved from "right" when the text became llama.cpp's (codes from the fp32 d): see WHY
            _q8("quantize_q8_0_flat_tile", "ref"),
            _q8("quantize_q8_0_flat_tile", "dequantize_q8_0_flat_tile"),
        ],
        "right": [
            _q8("ref", "dequantize_q8_0_flat_tile"),
        ],
    },
    "q4_0": {
        "wrong": [
            _q4("quantize_q4_0_unsigned_scale", "ref"),
            _q4("quantize_q4_0_no_clamp15", "ref"),
            _q4("quantize_q4_0_adjacent_pairs", "dequantize_q4_0_adjacent_pairs"),
            _q4("quantize_q4_0_zero_block_code0", "ref"),
            _q4("quantize_q4_0_nibbles_swapped", "dequantize_q4_0_nibbles_swapped"),
            _q4("ref", "dequantize_q4_0_forget_offset"),
            # moved from "right" when the text became llama.cpp's (codes from the fp32 d, the tie rule): see WHY
            _q4("quantize_q4_0_split_halves", "ref"),
            _q4("quantize_q4_0_split_halves", "dequantize_q4_0_join_halves"),
        ],
        "right": [
            _q4("ref", "dequantize_q4_0_join_halves"),
        ],
    },
    "int8_matmul": {
        "wrong": [
            "int8_weight_matmul_no_kmask",
            "int8_weight_matmul_tf32",
            "int8_weight_matmul_fp32_out",
            "int8_weight_matmul_stride_assumed_k",
            "int8_weight_matmul_2d_only",
            "int8_weight_matmul_no_shape_check",
        ],
        "right": ["int8_weight_matmul_per_code_scales", "int8_weight_matmul_wide_k"],
    },
    "int8_matmul_memory": {
        "wrong": [
            "int8_weight_matmul_dequant_then_mm",
            "int8_weight_matmul_expanded_scales",
            "int8_weight_matmul_keeps_scale_cache",
        ],
        "right": ["int8_weight_matmul_per_code_scales", "int8_weight_matmul_wide_k"],
    },
    "blockwise": {
        "wrong": [
            _bw("quantize_blockwise_round_up", "ref"),
            _bw("quantize_blockwise_fixed_block", "dequantize_blockwise_fixed_block"),
            _bw("quantize_blockwise_input_dtype_absmax", "ref"),
            _bw("quantize_blockwise_nan_zero_block", "ref"),
            _bw("ref", "dequantize_blockwise_keeps_padding"),
        ],
        "right": [
            _bw("quantize_blockwise_neighbours", "ref"),
            _bw("ref", "dequantize_blockwise_repeat"),
            _bw("quantize_blockwise_neighbours", "dequantize_blockwise_repeat"),
        ],
    },
    "adamw8bit_step": {
        "wrong": [
            "AdamW8bit_no_bias_correction",
            "AdamW8bit_l2_decay",
            "AdamW8bit_fp32_path_no_decay",
            "AdamW8bit_requantized_update",
            "AdamW8bit_whole_tensor",
            "AdamW8bit_absmax_chunk_index",
            "AdamW8bit_signed_code_for_v",
            "AdamW8bit_grad_overwritten",
            "AdamW8bit_no_sqrt",
            "AdamW8bit_eps_inside_sqrt",
        ],
        "right": ["AdamW8bit_folded_bias_correction", "AdamW8bit_block_loop"],
    },
    "adamw8bit_convergence": {
        "wrong": ["AdamW8bit_no_sqrt"],
        "right": ["AdamW8bit_folded_bias_correction", "AdamW8bit_block_loop"],
    },
}

WHY = {
    "quantize_q8_0_fp32_scale_codes": "written against the old text (which rounded d to fp16 before the codes), where "
                                      "its fp32-scale codes were the bug; under the llama.cpp text that part is right, "
                                      "but it computes x / d (Triton's /) instead of roundf(x · id) with id = 1 / d: "
                                      "violates 'q = roundf(x · id)' and 'x / d instead of x · id rounds differently "
                                      "for a few values near a half' (stays wrong; rejected on the near-half cases)",
    "quantize_q8_0_flat_tile": "MOVED right -> wrong: it rounds d to fp16 and makes the codes with the fp16 d (the old "
                               "text's rule); the llama.cpp text says 'The codes were made with the fp32 d, not with "
                               "the stored one' and 'codes made with the fp16-rounded scale differ in many blocks'",
    "quantize_q4_0_split_halves": "MOVED right -> wrong: codes made with the fp16-rounded d (the old rule), and m = "
                                  "the positive value when +a and -a tie; the llama.cpp text: 'd is stored as fp16(d)' "
                                  "after the codes are made with the fp32 d, and 'Where several values share that "
                                  "magnitude ... m is the **first** of them in the block's order'",
    "quantize_q8_0_truncate": "q = int(x / d) truncates: violates 'q = round(x / d) ... rounding half away from zero'",
    "quantize_q8_0_half_even": "ties rounded to even (rint): violates 'rounding half away from zero, as llama.cpp does'",
    "quantize_q8_0_tail_unmasked": "loads mask by block index only, reading past n in the last block: violates "
                                   "'load a [BLOCKS, 32] tile of values (masked past n: zeros)'",
    "quantize_q8_0_strided_input": "passes a non-contiguous w's pointer straight to the kernel: violates 'w (any shape)' "
                                   "/ 'flattened, row-major'",
    "quantize_q8_0_torch_scales": "absmax/127 computed in PyTorch: violates 'PyTorch does no arithmetic: the kernels do'",
    "dequantize_q8_0_fp32_out": "always fp32 output: violates 'returns a tensor of qt.shape and qt.dtype'",
    "dequantize_q8_0_fp16_multiply": "q · d computed in fp16, then cast (x̂ rounded to 11 bits first): violates "
                                     "'x̂ = q · d, stored in the output's dtype' (bound: d/2 + rounding to THAT dtype)",
    "dequantize_q8_0_no_check": "skips check_quantized: violates 'Use check_float_tensor and check_quantized for bad input'",
    "quantize_q4_0_unsigned_scale": "d = absmax / −8 with the sign dropped: violates 'Its scale is **signed**: d = m / −8, "
                                    "where m is the value of largest magnitude *with its sign*'",
    "quantize_q4_0_no_clamp15": "q = ⌊x/d + 8.5⌋ without min(15, ·): code 16 wraps in the nibble; violates "
                                "'q = min(15, ⌊x/d + 8.5⌋) in [0, 15]'",
    "quantize_q4_0_adjacent_pairs": "values 2j, 2j+1 in byte j: violates 'byte j of a block holds value j in its low "
                                    "nibble and value j + 16 in its high nibble'",
    "dequantize_q4_0_adjacent_pairs": "reads the same wrong layout (pair of the adjacent-pairs quantizer)",
    "quantize_q4_0_zero_block_code0": "zero block stored with codes 0: violates '(a block of zeros: d = 0, codes 8, so "
                                      "x̂ = 0)'",
    "quantize_q4_0_nibbles_swapped": "value j in the high nibble: violates 'value j in its low nibble and value j + 16 in "
                                     "its high nibble'",
    "dequantize_q4_0_nibbles_swapped": "reads the swapped layout (pair of the swapped quantizer)",
    "dequantize_q4_0_forget_offset": "x̂ = q · d: the − 8 term forgotten; violates 'x̂ = (q − 8) · d'",
    "int8_weight_matmul_no_kmask": "no mask on K: violates 'mask the ragged ends of M, N and K' (K a multiple of 32 "
                                   "but not of BLOCK_K)",
    "int8_weight_matmul_tf32": "tl.dot without input_precision='ieee' in fp32: violates 'in fp32 pass "
                               "input_precision=\"ieee\"' (only visible on a GPU)",
    "int8_weight_matmul_fp32_out": "returns the fp32 accumulator: violates 'y of shape (..., N) in x's dtype'",
    "int8_weight_matmul_stride_assumed_k": "row stride taken as K and x never made contiguous: wrong for a strided x "
                                           "(x of shape (..., K) need not be contiguous)",
    "int8_weight_matmul_2d_only": "M = x.shape[0]: violates 'x of shape (..., K) ... y of shape (..., N)' for 3-D x",
    "int8_weight_matmul_no_shape_check": "no check of x's K against the weight nor K % 32: violates 'Bad input (... K "
                                         "mismatched or not a multiple of 32 ...) raises ValueError'",
    "int8_weight_matmul_dequant_then_mm": "dequantize-then-matmul: violates 'no tensor the size of Ŵ may exist during "
                                          "the call'",
    "int8_weight_matmul_expanded_scales": "expands the scales to one fp32 per code in PyTorch (N·K·4 bytes): violates "
                                          "'no tensor the size of Ŵ may exist during the call'",
    "int8_weight_matmul_keeps_scale_cache": "caches Ŵ in a module global that outlives the call: violates 'Ŵ never "
                                            "exists in memory' / the memory check",
    "quantize_blockwise_round_up": "bucketize against the levels, not the midpoints: violates 'the index of the code "
                                   "level nearest to x / absmax'",
    "dequantize_blockwise_fixed_block": "ignores the block argument (pair of quantize_blockwise_fixed_block)",
    "quantize_blockwise_fixed_block": "ignores the block argument, always 256: violates the signature's "
                                      "'block: int = STATE_BLOCK' option",
    "quantize_blockwise_input_dtype_absmax": "absmax (and the normalization) in x's dtype: violates '`absmax` fp32'",
    "quantize_blockwise_nan_zero_block": "x / absmax unguarded: a zero block gives NaN, coded as the top level; violates "
                                         "'(a block of zeros: absmax 0)' and 'nearest level'",
    "dequantize_blockwise_keeps_padding": "returns the padded ceil(n/block)·block values: violates 'returns the fp32 "
                                          "values code[codes] · absmax, flattened' (n of them)",
    "AdamW8bit_no_bias_correction": "drops 1−βᵗ: violates 'p ← p − lr · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε)'",
    "AdamW8bit_l2_decay": "weight decay added to the gradient: violates '1. decoupled weight decay, as "
                          "torch.optim.AdamW: p ← p · (1 − lr · wd)'",
    "AdamW8bit_fp32_path_no_decay": "small parameters never decay: violates '3. the fp32 path ... the same update'",
    "AdamW8bit_requantized_update": "p updated with the requantized m, v: violates 'apply ... **with these fp32 "
                                    "values**, then quantize them back'",
    "AdamW8bit_whole_tensor": "ignores chunk, whole m and v in fp32: violates 'step() may allocate at most 1 byte per "
                              "parameter with chunk=4096'",
    "AdamW8bit_absmax_chunk_index": "absmax slice starts at s // chunk: violates 'quantize them back into the chunk's "
                                    "codes and absmax' for every chunk after the first",
    "AdamW8bit_signed_code_for_v": "v on the signed code: violates the class docstring / _state's codes "
                                   "('[0, 1] (v)', the unsigned code for v)",
    "AdamW8bit_grad_overwritten": "g.mul_(g) squares p.grad in place (float() of an fp32 grad is a view): inputs "
                                  "overwritten; the text never allows touching the gradient",
    "AdamW8bit_no_sqrt": "divides by v̂ + ε: the √ of the formula forgotten; diverges",
    "AdamW8bit_eps_inside_sqrt": "√(v̂ + ε) instead of √v̂ + ε: violates the update formula",
}
