"""Known-wrong (and known-right alternative) implementations of lesson 07's exercises. Most are written in
PyTorch: the checks reject their numbers before they reach the check that the kernels do the arithmetic."""
import memfit.from_lessons.quantization as ref  # first: memfit selects Triton's interpreter before triton loads
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

Q = ref.Quantized


def _blocks(w):  # on the CPU, where PyTorch's float32 arithmetic is IEEE's (CUDA divides by a scalar as a product)
    flat = w.reshape(-1).float().cpu()
    return F.pad(flat, (0, (-flat.numel()) % 32)).view(-1, 32)


# ----------------------------------------------------------------------------------------- Q8_0
def _roundf(v):  # C's roundf, exact (the lesson's rule)
    a = v.abs()
    whole = a.floor()
    r = torch.where(a - whole >= 0.5, whole + 1, whole)
    return torch.where(v < 0, -r, r)


def _inverse(d):
    return torch.where(d != 0, 1 / torch.where(d != 0, d, 1.0), 0.0)


def _q8(w, rounding=_roundf, divisor=127, spread=lambda b: b.abs().amax(dim=1), codes_from_fp16=False, divide=False):
    """llama.cpp's Q8_0 in PyTorch (fp32: d = absmax / 127, codes roundf(x * (1 / d))), with one thing changed."""
    b = _blocks(w)
    d = spread(b) / divisor
    dc = d.half().float() if codes_from_fp16 else d
    v = torch.where(dc[:, None] != 0, b / torch.where(dc != 0, dc, 1.0)[:, None], 0.0) if divide else \
        b * _inverse(dc)[:, None]
    q = rounding(v).clamp(-127, 127)
    return Q("q8_0", q.to(torch.int8).to(w.device), d.half().to(w.device), w.shape, w.dtype)


def q8_truncates(w):  # int() of x * id: toward zero, an error up to d instead of d/2
    return _q8(w, rounding=torch.trunc)


def q8_scale_255(w):  # the scale of a [-255, 255] range with int8 codes
    return _q8(w, divisor=255)


def q8_scale_from_mean(w):  # the scale from the block's mean |value|, not its absmax: large values clip at 127
    return _q8(w, spread=lambda b: b.abs().mean(dim=1))


def q8_fp16_scale_codes(w):  # codes made with the stored fp16 scale (this lesson's old rule), not the fp32 one
    return _q8(w, codes_from_fp16=True)


def q8_divides(w):  # codes roundf(x / d): right but for a few values near a half, where x * (1 / d) rounds otherwise
    return _q8(w, divide=True)


def q8_floor_half(w):  # floor(v + 0.5) in fp32 (this lesson's old round_half_away): 0.5 - 2^-25 rounds to 1
    return _q8(w, rounding=lambda v: torch.where(v >= 0, (v + 0.5).floor(), -(0.5 - v).floor()))


def q8_dequantize(qt):
    return (qt.data.float() * qt.scales.float()[:, None]).reshape(-1)[:qt.numel].view(qt.shape).to(qt.dtype)


def q8_dequantize_drops_tail(qt):  # whole blocks only: a length not a multiple of 32 leaves its tail unwritten
    out = torch.empty(qt.numel, dtype=qt.dtype, device=qt.data.device)
    whole = qt.numel // 32 * 32
    out[:whole] = (qt.data.float() * qt.scales.float()[:, None]).reshape(-1)[:whole].to(qt.dtype)
    return out.view(qt.shape)


def q8_in_pytorch(w):  # right numbers, but PyTorch does the arithmetic
    return _q8(w)


def _launch_8_blocks(kernel, blocks, *args):  # the reference's launch_blocks with 8 blocks of 32 per program
    if blocks:
        kernel[(triton.cdiv(blocks, 8),)](*args, BLOCKS=8, num_warps=4, **ref.BLOCK_LAUNCH_OPTIONS)


def _quantize_8_blocks(kernel, fmt, w):
    ref.check_float_tensor(w, "the tensor to quantize")
    flat = w.reshape(-1).contiguous()  # (a strided view reshape(-1) keeps: the kernels read values in a row)
    qt = ref.empty_quantized(w, fmt)
    _launch_8_blocks(kernel, qt.scales.numel(), flat, qt.data, qt.scales, flat.numel(), qt.scales.numel())
    return qt


def _dequantize_8_blocks(kernel, fmt, qt):
    ref.check_quantized(qt, fmt)
    out = torch.empty(qt.shape, dtype=qt.dtype, device=qt.data.device)
    _launch_8_blocks(kernel, qt.scales.numel(), qt.data, qt.scales, out, qt.numel)
    return out


def q8_quantize_8_blocks(w):  # right: 8 blocks per program (the CPU config says 4, a GPU's 64)
    return _quantize_8_blocks(ref.q8_0_quantize_kernel, "q8_0", w)


def q8_dequantize_8_blocks(qt):  # right
    return _dequantize_8_blocks(ref.q8_0_dequantize_kernel, "q8_0", qt)


# ----------------------------------------------------------------------------------------- Q4_0
def _q4(w, pack, clamp=True, codes_from_fp16=False, positive_wins_ties=False, divide=False, fma=False):
    """llama.cpp's Q4_0 in PyTorch (fp32: m the first value of largest magnitude, d = m / -8, codes
    min(15, trunc(x * (1 / d) + 8.5)), each operation rounded), with one thing changed."""
    b = _blocks(w)
    if positive_wins_ties:
        top, bottom = b.amax(dim=1), b.amin(dim=1)
        m = torch.where(top >= -bottom, top, bottom)
    else:
        m = b.gather(1, (b.abs() == b.abs().amax(dim=1, keepdim=True)).int().argmax(dim=1, keepdim=True))[:, 0]
    m = torch.where(m == 0, 0.0, m)  # a block of zeros, +0 and -0 alike: m = +0 (llama.cpp's scan starts there)
    d = m / -8
    dc = d.half().float() if codes_from_fp16 else d
    if divide:
        v = torch.where(dc[:, None] != 0, b / torch.where(dc != 0, dc, 1.0)[:, None], 0.0) + 8.5
    elif fma:  # the product and the sum rounded once, as one fma
        v = (b.double() * _inverse(dc).double()[:, None] + 8.5).float()
    else:
        v = b * _inverse(dc)[:, None] + 8.5
    q = v.trunc()
    q = (q.clamp(max=15) if clamp else q).to(torch.uint8)
    return Q("q4_0", pack(q).to(w.device), d.half().to(w.device), w.shape, w.dtype)


def _llama_pack(q):
    return q[:, :16] | (q[:, 16:] << 4)


def q4_interleaved(w):  # byte j holds values 2j and 2j + 1: not the format's layout
    return _q4(w, lambda q: q[:, 0::2] | (q[:, 1::2] << 4))


def q4_no_clamp(w):  # the positive side reaches code 16, which wraps to 0 in a nibble
    return _q4(w, _llama_pack, clamp=False)


def q4_fp16_scale_codes(w):  # codes made with the stored fp16 scale (this lesson's old rule)
    return _q4(w, _llama_pack, codes_from_fp16=True)


def q4_positive_wins_ties(w):  # +a and -a tied: m = +a (this lesson's old rule), not the first of them
    return _q4(w, _llama_pack, positive_wins_ties=True)


def q4_divides(w):  # x / d + 8.5 instead of x * (1 / d) + 8.5
    return _q4(w, _llama_pack, divide=True)


def q4_fma(w):  # x * id + 8.5 rounded once (what Triton's default fp fusion does on a GPU)
    return _q4(w, _llama_pack, fma=True)


def q4_quantize(w):
    return _q4(w, _llama_pack)


def q4_dequantize(qt):
    codes = torch.cat([qt.data & 15, qt.data >> 4], dim=1).float()
    return ((codes - 8) * qt.scales.float()[:, None]).reshape(-1)[:qt.numel].view(qt.shape).to(qt.dtype)


def q4_quantize_8_blocks(w):  # right: 8 blocks per program
    return _quantize_8_blocks(ref.q4_0_quantize_kernel, "q4_0", w)


def q4_dequantize_8_blocks(qt):  # right
    return _dequantize_8_blocks(ref.q4_0_dequantize_kernel, "q4_0", qt)


# ---------------------------------------------------------------------------------- int8 matmul
def mm_dequantize_then_matmul(x, qw):  # right numbers; a full copy of Ŵ per call
    return x @ ref.dequantize_q8_0(qw).T


def mm_one_scale_per_row(x, qw):  # every block of a row scaled by the row's first scale
    n, k = qw.shape
    scales = qw.scales.view(n, k // 32)[:, :1].expand(n, k // 32).reshape(-1)
    return ref.int8_weight_matmul(x, Q("q8_0", qw.data, scales.contiguous(), qw.shape, qw.dtype))


def _mm_launch(x, qw, split=None, tiles=None, zero=None, grid_splits=None, y_dtype=None):
    """The reference kernel, launched as a variant would: `tiles` (default: int8_matmul_tiles(M)) with SPLIT_K =
    `split` if given; y in `y_dtype` (default: fp32 when K is split, else x's dtype), zeroed or not (default: when
    K is split); the grid's third axis `grid_splits` (default: SPLIT_K)."""
    ref.check_int8_matmul_inputs(x, qw)
    n, k = qw.shape
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    tiles = dict(tiles or ref.int8_matmul_tiles(m))
    tiles["SPLIT_K"] = split or tiles["SPLIT_K"]
    split = tiles["SPLIT_K"]
    zero = split > 1 if zero is None else zero
    y_dtype = y_dtype or (torch.float32 if split > 1 else x.dtype)
    y = (torch.zeros if zero else torch.empty)(m, n, dtype=y_dtype, device=x.device)
    if m and n:
        grid = (triton.cdiv(m, tiles["BLOCK_M"]), triton.cdiv(n, tiles["BLOCK_N"]), grid_splits or split)
        ref.int8_matmul_kernel[grid](x2, qw.data, qw.scales, y, m, n, k, x2.stride(0), y.stride(0),
                                     IEEE=x.dtype == torch.float32, **tiles)
    return y.to(x.dtype).reshape(*x.shape[:-1], n)


def mm_other_tiles(x, qw):  # right: other tiles (16 x 16 outputs, 4 blocks of 32 along K per step), one slice of K
    return _mm_launch(x, qw, tiles=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=128, SPLIT_K=1, num_warps=4))


def mm_split_k_not_zeroed(x, qw):  # atomic adds onto torch.empty: whatever the memory held is added too
    return _mm_launch(x, qw, 2, zero=False)


def mm_split_k_one_slice_launched(x, qw):  # SPLIT_K = 2 in the kernel, but a grid of one slice: half of K summed
    return _mm_launch(x, qw, 2, grid_splits=1)


def mm_split_k_in_x_dtype(x, qw):  # the slices' partial sums added into a zeroed y of x's dtype, not fp32
    return _mm_launch(x, qw, 2, y_dtype=x.dtype)


def mm_tile_not_rounded(x, qw):  # x upcast to fp32, the tile of Ŵ kept in fp32: not dequantize-then-matmul's product
    return ref.int8_weight_matmul(x.float(), qw).to(x.dtype)


def mm_split_k_3(x, qw):  # right: three slices of K, whatever the class of M (the last ones ragged or empty)
    return _mm_launch(x, qw, 3)


@triton.jit
def _mm_no_k_mask_kernel(x_ptr, data_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk  # no mask on k: the last step reads past the row (the next row's codes)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=rm[:, None] < M, other=0.0)
        q = tl.load(data_ptr + rn[None, :] * K + k[:, None], mask=rn[None, :] < N, other=0)
        d = tl.load(scale_ptr + rn[None, :] * (K // 32) + (k // 32)[:, None], mask=rn[None, :] < N, other=0.0)
        acc += tl.dot(x, (q.to(tl.float32) * d.to(tl.float32)).to(x.dtype), input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def mm_no_k_mask(x, qw):
    n, k = qw.shape
    x2 = torch.cat([x.reshape(-1, k), torch.zeros(1, k, dtype=x.dtype, device=x.device)])  # keep reads in bounds
    m = x2.shape[0] - 1
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    data = torch.cat([qw.data.reshape(-1), torch.ones(256, dtype=torch.int8, device=x.device)])
    scales = torch.cat([qw.scales, torch.ones(8, dtype=torch.float16, device=x.device)])
    tiles = {key: v for key, v in ref.int8_matmul_tiles(m).items() if key != "SPLIT_K"}
    _mm_no_k_mask_kernel[(triton.cdiv(m, tiles["BLOCK_M"]), triton.cdiv(n, tiles["BLOCK_N"]))](
        x2, data, scales, y, m, n, k, x2.stride(0), y.stride(0), IEEE=True, **tiles)
    return y.reshape(*x.shape[:-1], n)


# ------------------------------------------------------------------------------ blockwise states
def bw_per_tensor(x, code, block=256):  # one absmax for the whole tensor
    flat = x.reshape(-1).float()
    absmax = flat.abs().max().reshape(1)
    idx = torch.bucketize(flat / absmax.clamp_min(1e-30), (code[1:] + code[:-1]) / 2)
    return idx.to(torch.uint8), absmax


def bw_floor_level(x, code, block=256):  # the level below, not the nearest
    codes, absmax = ref.quantize_blockwise(x, code, block)
    flat = F.pad(x.reshape(-1).float(), (0, (-x.numel()) % block)).view(-1, block)
    r = (flat / torch.where(absmax > 0, absmax, 1.0)[:, None]).reshape(-1)[:x.numel()]
    below = (torch.searchsorted(code, r, right=True) - 1).clamp(0, code.numel() - 1)
    return below.to(torch.uint8), absmax


def bw_quantize_by_distance(x, code, block=256):  # right: argmin of |r - level| over all levels, not bucketize
    flat = x.reshape(-1).float()
    n = flat.numel()
    blocks = F.pad(flat, (0, (-n) % block)).view(-1, block)
    absmax = blocks.abs().amax(dim=1)
    r = (blocks / torch.where(absmax > 0, absmax, 1.0)[:, None]).reshape(-1)[:n]
    levels = code.to(r.device)
    codes = torch.cat([(part[:, None] - levels[None, :]).abs().argmin(dim=1) for part in r.split(4096)]) \
        if n else torch.zeros(0, dtype=torch.long, device=r.device)
    return codes.to(torch.uint8), absmax


def bw_dequantize_by_take(codes, absmax, code, block=256):  # right: torch.take with int64 indices, then the scale
    n = codes.numel()
    values = torch.take(code.to(codes.device), codes.reshape(-1).long())
    return (F.pad(values, (0, (-n) % block)).view(-1, block) * absmax[:, None]).reshape(-1)[:n]


def bw_dequantize_with_mask(codes, absmax, code, block=256):  # code[uint8 tensor] is a boolean mask
    values = code[codes]
    return (F.pad(values, (0, (-values.numel()) % block)).view(-1, block) * absmax[:, None]).reshape(-1)[:codes.numel()]


# --------------------------------------------------------------------------------------- AdamW8bit
class _Adam(ref.AdamW8bit):
    """The reference's step with one thing changed (a flag per mutant)."""
    bias_correction, update_from_rounded, store, chunked, l2 = True, False, True, True, False

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            chunk = group["chunk"] if self.chunked else 1 << 40
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, group)
                state["step"] += 1
                t = state["step"]
                c1, c2 = (1 - b1**t, 1 - b2**t) if self.bias_correction else (1.0, 1.0)
                grad = p.grad + group["weight_decay"] * p if self.l2 else p.grad
                if not self.l2:
                    p.mul_(1 - lr * group["weight_decay"])
                eight = "m_absmax" in state
                n = p.numel()
                for start in range(0, n, chunk if eight else n):
                    end = min(n, start + chunk) if eight else n
                    blocks = slice(start // 256, triton.cdiv(end, 256))
                    g = grad.reshape(-1)[start:end].float()
                    if eight:
                        m = ref.dequantize_blockwise(state["m"][start:end], state["m_absmax"][blocks], self.codes["m"])
                        v = ref.dequantize_blockwise(state["v"][start:end], state["v_absmax"][blocks], self.codes["v"])
                    else:
                        m, v = state["m"].view(-1), state["v"].view(-1)
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                    if eight and (self.store or self.update_from_rounded):
                        packed = {k: ref.quantize_blockwise(val, self.codes[k]) for k, val in (("m", m), ("v", v))}
                        if self.update_from_rounded:
                            m = ref.dequantize_blockwise(*packed["m"], self.codes["m"])
                            v = ref.dequantize_blockwise(*packed["v"], self.codes["v"])
                        if self.store:
                            for k, (codes, absmax) in packed.items():
                                state[k][start:end] = codes
                                state[k + "_absmax"][blocks] = absmax
                    update = (m / c1) / ((v / c2).sqrt() + eps)
                    p.view(-1)[start:end] -= lr * update.to(p.dtype)


class adam_no_bias_correction(_Adam):
    bias_correction = False


class adam_update_from_rounded_states(_Adam):  # the update reads m and v after they were rounded
    update_from_rounded = True


class adam_never_stores_states(_Adam):  # computes m and v, never writes them back
    store = False


class adam_whole_tensor(_Adam):  # dequantizes a whole state at once: 4 bytes per parameter and more
    chunked = False


class adam_l2_decay(_Adam):  # Adam with L2 (decay added to the gradient), not AdamW's decoupled decay
    l2 = True


class adam_fp32_states(ref.AdamW8bit):  # every state in fp32: no saving
    def __init__(self, params, *args, **kwargs):
        kwargs["min_8bit_size"] = 1 << 62
        super().__init__(params, *args, **kwargs)


class adam_right_by_subclass(_Adam):
    """Right: the same algorithm written differently (flags at their right values)."""


# ------------------------------------------------------------------------------- issue 24's additions
@triton.jit
def _q8_dequantize_by_block_kernel(data_ptr, scale_ptr, out_ptr, n, BLOCKS: tl.constexpr):
    rows = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    offs = rows[:, None] * 32 + tl.arange(0, 32)[None, :]
    live = rows < tl.cdiv(n, 32)  # masked by block, not by n: the last block's tail is written past the end
    q = tl.load(data_ptr + offs, mask=live[:, None], other=0).to(tl.float32)
    d = tl.load(scale_ptr + rows, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (q * d[:, None]).to(out_ptr.dtype.element_ty), mask=live[:, None])


def q8_dequantize_masked_by_block(qt):  # right values, but up to 31 elements stored past the output's end
    return _dequantize_8_blocks(_q8_dequantize_by_block_kernel, "q8_0", qt)


_CACHE: dict = {}


def mm_keeps_cache(x, qw):  # right numbers from the reference kernel, and fp32 scales kept in a global "for next time"
    key = (qw.data.data_ptr(), x.dtype)
    if key not in _CACHE:
        _CACHE[key] = (qw.data, qw.scales.float())
    return ref.int8_weight_matmul(x, qw)


# What a notebook's AdamW8bit sees: its own (here: wrong) quantize_blockwise / dequantize_blockwise as globals.
def quantize_blockwise(x, code, block=256):
    return bw_floor_level(x, code, block)


def dequantize_blockwise(codes, absmax, code, block=256):
    return bw_dequantize_by_take(codes, absmax, code, block) * 1.5


class adam_with_broken_blockwise(ref.AdamW8bit):
    """The reference's step, calling the module's own quantize_blockwise / dequantize_blockwise (exercise 4's bug):
    graded with the reference ones, it keeps exercise 5's points."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps, chunk = group["lr"], group["betas"], group["eps"], group["chunk"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, group)
                state["step"] += 1
                t = state["step"]
                c1, c2 = 1 - b1**t, 1 - b2**t
                p.mul_(1 - lr * group["weight_decay"])
                if "m_absmax" not in state:
                    m, v, g = state["m"], state["v"], p.grad.float()
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                    p.sub_(lr * (m / c1) / ((v / c2).sqrt() + eps))
                    continue
                for start in range(0, p.numel(), chunk):
                    end = min(start + chunk, p.numel())
                    blocks = slice(start // 256, triton.cdiv(end, 256))
                    m = dequantize_blockwise(state["m"][start:end], state["m_absmax"][blocks], self.codes["m"])
                    v = dequantize_blockwise(state["v"][start:end], state["v_absmax"][blocks], self.codes["v"])
                    g = p.grad.reshape(-1)[start:end].float()
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                    p.view(-1)[start:end] -= lr * (m / c1) / ((v / c2).sqrt() + eps)
                    for name, values in (("m", m), ("v", v)):
                        state[name][start:end], state[name + "_absmax"][blocks] = \
                            quantize_blockwise(values, self.codes[name])
