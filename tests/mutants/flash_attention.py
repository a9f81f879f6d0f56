"""Known-wrong (and known-right alternative) implementations of lesson 05's exercises."""
import math

import memfit.from_lessons.flash_attention as ref  # first: memfit selects Triton's interpreter before triton loads
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

_attend = ref._attend  # the reference's inner loop, called from the forward kernel copy below


# ---------------------------------------------------------------------------------- online softmax
def softmax_stats_without_max(blocks):  # sums exp(x) itself and divides by exp(m) at the end: overflows near 500
    m = total = None
    for block in blocks:
        x = block.float()
        m = x.amax(dim=1) if m is None else torch.maximum(m, x.amax(dim=1))
        total = x.exp().sum(dim=1) if total is None else total + x.exp().sum(dim=1)
    return m, total * torch.exp(-m)


def softmax_stats_without_rescale(blocks):  # adds each block's sum at its new max, never rescales the old sum
    m = l = None
    for block in blocks:
        x = block.float()
        m = x.amax(dim=1) if m is None else torch.maximum(m, x.amax(dim=1))
        l = torch.exp(x - m[:, None]).sum(dim=1) if l is None else l + torch.exp(x - m[:, None]).sum(dim=1)
    return m, l


def softmax_stats_nan_on_inf_prefix(blocks):  # no guard: exp(-inf - -inf) is NaN for rows that saw only -inf
    m = l = None
    for block in blocks:
        x = block.float()
        if m is None:
            m = torch.full(x.shape[:1], float("-inf"), device=x.device)
            l = torch.zeros(x.shape[:1], device=x.device)
        m_new = torch.maximum(m, x.amax(dim=1))
        l = l * torch.exp(m - m_new) + torch.exp(x - m_new[:, None]).sum(dim=1)
        m = m_new
    return m, l


def softmax_stats_cat_logsumexp(blocks):  # exp(logsumexp(x) - m): rounded at m's scale, l's error grows with |m|
    x = torch.cat([block.float() for block in blocks], dim=1)
    m = x.amax(dim=1)
    return m, torch.exp(torch.logsumexp(x, dim=1) - torch.where(m == float("-inf"), 0.0, m))


def softmax_stats_cat_shifted_logsumexp(blocks):  # right: logsumexp of x - m, whose result is small, then exp
    x = torch.cat([block.float() for block in blocks], dim=1)
    m = x.amax(dim=1)
    return m, torch.exp(torch.logsumexp(x - torch.where(m == float("-inf"), 0.0, m)[:, None], dim=1))


def softmax_stats_cat(blocks):  # right: reads the one pass into memory, then the two-pass formula
    x = torch.cat([block.float() for block in blocks], dim=1)
    m = x.amax(dim=1)
    return m, torch.exp(x - m[:, None]).sum(dim=1)


# ---------------------------------------------------------------------------------- tiled attention
def _tiled(q, k, v, causal, block_m, block_n, ahead=0, rescale_acc=True, lse_log2=False, skip_future=True):
    """ref.attention_tiled with knobs: a key may be `ahead` past its query; acc rescaled by alpha or not; lse in
    log2 units or not; the key blocks above the causal diagonal skipped or visited (all masked)."""
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, h, n, dtype=torch.float32, device=q.device)
    for start_m in range(0, n, block_m):
        end_m = min(start_m + block_m, n)
        rows = torch.arange(start_m, end_m, device=q.device)
        q_tile = q[:, :, start_m:end_m].float() * d ** -0.5
        m = torch.full((b, h, end_m - start_m), float("-inf"), device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(b, h, end_m - start_m, d, device=q.device)
        for start_n in range(0, end_m if causal and skip_future else n, block_n):
            end_n = min(start_n + block_n, n)
            s = q_tile @ k[:, :, start_n:end_n].float().transpose(-2, -1)
            if causal:
                keys = torch.arange(start_n, end_n, device=q.device)
                s = s.masked_fill(keys[None, :] > rows[:, None] + ahead, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=-1)
            acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v[:, :, start_n:end_n].float()
            m = m_new
        o[:, :, start_m:end_m] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, start_m:end_m] = (m + torch.log(l)) * (ref.LOG2E if lse_log2 else 1.0)
    return o, lse


def tiled_naive(q, k, v, causal=False, block_m=64, block_n=64):  # materialises the full N x N scores
    s = (q.float() @ k.float().transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return ref.naive_attention(q, k, v, causal), torch.logsumexp(s, dim=-1)


def tiled_causal_sees_next_key(q, k, v, causal=False, block_m=64, block_n=64):  # mask keys > row + 1, not > row
    return _tiled(q, k, v, causal, block_m, block_n, ahead=1)


def tiled_causal_masks_diagonal(q, k, v, causal=False, block_m=64, block_n=64):  # mask keys >= row: row 0 sees none
    return _tiled(q, k, v, causal, block_m, block_n, ahead=-1)


def tiled_lse_log2(q, k, v, causal=False, block_m=64, block_n=64):  # lse in log2 units (m + log l, times log2 e)
    return _tiled(q, k, v, causal, block_m, block_n, lse_log2=True)


def tiled_acc_not_rescaled(q, k, v, causal=False, block_m=64, block_n=64):  # acc never multiplied by alpha
    return _tiled(q, k, v, causal, block_m, block_n, rescale_acc=False)


def tiled_visits_every_block(q, k, v, causal=False, block_m=64, block_n=64):  # right: no skip above the diagonal
    return _tiled(q, k, v, causal, block_m, block_n, skip_future=False)


# ------------------------------------------------------------------------------------- Triton forward
@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n, d, qk_scale,
                    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    LSE_LOG2: tl.constexpr, DIAGONAL_CAUSAL: tl.constexpr):
    """ref.flash_forward_kernel with knobs: LSE_LOG2 stores m + log2(l) without the * ln2; DIAGONAL_CAUSAL=False
    masks the diagonal block for keys past n only, not for keys after their query."""
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    bh = tl.program_id(1)
    head = bh.to(tl.int64) * n * d
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    tile = rows[:, None] * d + cols[None, :]
    io_ok = (rows[:, None] < n) & (cols[None, :] < d)
    q = tl.load(q_ptr + head + tile, mask=io_ok, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if CAUSAL:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptr + head, v_ptr + head, rows, 0, start_m, n, qk_scale,
                                False, CAUSAL, BLOCK_N, d, BLOCK_D)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptr + head, v_ptr + head, rows, start_m,
                                tl.minimum(start_m + BLOCK_M, n), n, qk_scale, True, DIAGONAL_CAUSAL, BLOCK_N, d,
                                BLOCK_D)
    else:
        full = (n // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptr + head, v_ptr + head, rows, 0, full, n, qk_scale,
                                False, CAUSAL, BLOCK_N, d, BLOCK_D)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptr + head, v_ptr + head, rows, full, n, n, qk_scale,
                                True, CAUSAL, BLOCK_N, d, BLOCK_D)
    tl.store(o_ptr + head + tile, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=io_ok)
    lse = m_i + tl.log2(l_i)
    if not LSE_LOG2:
        lse = lse * 0.6931471805599453
    tl.store(lse_ptr + bh.to(tl.int64) * n + rows, lse, mask=rows < n)


def _forward(q, k, v, causal, grid_rows=triton.cdiv, tiles=None, lse_log2=False, diagonal_causal=True):
    ref.check_attention_inputs(q, k, v, ref.MAX_HEAD_DIM)
    b, h, n, d = q.shape
    q, k, v = ref.heads_contiguous(q, k, v)
    o = torch.empty_like(q)
    lse = torch.empty(b, h, n, dtype=torch.float32, device=q.device)
    default_tiles, launch = ref.flash_config("flash_forward", d)
    tiles = tiles or default_tiles
    _forward_kernel[(grid_rows(n, tiles["BLOCK_M"]), b * h)](
        q, k, v, o, lse, n, d, ref.LOG2E / math.sqrt(d), CAUSAL=causal, BLOCK_D=ref.block_d(d),
        LSE_LOG2=lse_log2, DIAGONAL_CAUSAL=diagonal_causal, **tiles, **launch)
    return o, lse


def _floor(n, block):  # the grid a `//` gives (at least one program, so the launch itself is valid)
    return max(1, n // block)


def forward_grid_floored(q, k, v, causal=False):  # n // BLOCK_M programs: the tail rows are never written
    return _forward(q, k, v, causal, grid_rows=_floor)


def forward_lse_log2(q, k, v, causal=False):  # the kernel stores m + log2(l), forgetting the * ln 2
    return _forward(q, k, v, causal, lse_log2=True)


def forward_diagonal_unmasked(q, k, v, causal=False):  # the causal diagonal block lets queries see later keys
    return _forward(q, k, v, causal, diagonal_causal=False)


def forward_with_torch(q, k, v, causal=False):  # right numbers, but PyTorch's attention and an N x N logsumexp
    ref.check_attention_inputs(q, k, v, ref.MAX_HEAD_DIM)
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal), torch.logsumexp(s, dim=-1).float()


def forward_other_tiles(q, k, v, causal=False):  # right: other tile sizes (BLOCK_N still divides BLOCK_M)
    return _forward(q, k, v, causal, tiles={"BLOCK_M": 64, "BLOCK_N": 32})


# ------------------------------------------------------------------------------- Triton backward: delta
@triton.jit
def _delta_kernel(o_ptr, do_ptr, delta_ptr, n, d, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  DO_ONLY: tl.constexpr, IN_INPUT_DTYPE: tl.constexpr, ROW_BLOCKS: tl.constexpr):
    """ref.flash_delta_kernel with knobs: DO_ONLY sums dO alone; IN_INPUT_DTYPE multiplies and sums in o's dtype;
    ROW_BLOCKS > 1: one program walks ROW_BLOCKS blocks of rows (a right alternative)."""
    bh = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    for r in range(ROW_BLOCKS):
        rows = (tl.program_id(0) * ROW_BLOCKS + r) * BLOCK_M + tl.arange(0, BLOCK_M)
        tile = bh.to(tl.int64) * n * d + rows[:, None] * d + cols[None, :]
        ok = (rows[:, None] < n) & (cols[None, :] < d)
        o = tl.load(o_ptr + tile, mask=ok, other=0.0)
        do = tl.load(do_ptr + tile, mask=ok, other=0.0)
        if DO_ONLY:
            delta = tl.sum(do.to(tl.float32), 1)
        elif IN_INPUT_DTYPE:
            delta = tl.sum((o * do).to(o.dtype), 1).to(o.dtype).to(tl.float32)
        else:
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(delta_ptr + bh.to(tl.int64) * n + rows, delta, mask=rows < n)


def _delta(o, do, grid_rows=triton.cdiv, block=64, do_only=False, in_input_dtype=False, contiguous=True,
           row_blocks=1):
    b, h, n, d = o.shape
    if contiguous:
        o, do = ref.heads_contiguous(o, do)
    delta = torch.empty(b, h, n, dtype=torch.float32, device=o.device)
    _delta_kernel[(grid_rows(n, block * row_blocks), b * h)](o, do, delta, n, d, BLOCK_M=block,
                                                             BLOCK_D=ref.block_d(d), DO_ONLY=do_only,
                                                             IN_INPUT_DTYPE=in_input_dtype, ROW_BLOCKS=row_blocks)
    return delta


def delta_of_do_only(o, do):  # rowsum(dO), the * O forgotten
    return _delta(o, do, do_only=True)


def delta_in_input_dtype(o, do):  # products and their sum rounded to o's dtype (fp16), not accumulated in fp32
    return _delta(o, do, in_input_dtype=True)


def delta_grid_floored(o, do):  # n // BLOCK_M programs: the rows of a partial last block are never written
    return _delta(o, do, grid_rows=_floor, block=16)


def delta_ignores_layout(o, do):  # no heads_contiguous: a transposed view is read as if contiguous
    return _delta(o, do, contiguous=False)


def delta_in_torch(o, do):  # right numbers from PyTorch: fp32 copies of o and dO, and their product
    return (do.float() * o.float()).sum(dim=-1)


def delta_small_blocks(o, do):  # right: 16 rows a program
    return _delta(o, do, block=16)


def delta_row_blocks_per_program(o, do):  # right: each program walks 4 blocks of 16 rows
    return _delta(o, do, block=16, row_blocks=4)


# ------------------------------------------------------------------------------------- Triton backward
def _backward(do, q, k, v, o, lse, causal, delta=None, dq_rows=triton.cdiv, dkdv_tiles=None, dq_tiles=None,
              delta_block=64):
    """ref.flash_attention_backward with knobs: a delta given from outside, the dq grid, the tile sizes."""
    ref.check_attention_inputs(q, k, v, ref.MAX_HEAD_DIM)
    b, h, n, d = q.shape
    q, k, v, o, do, lse = ref.heads_contiguous(q, k, v, o, do, lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if delta is None:
        delta = torch.empty(b, h, n, dtype=torch.float32, device=q.device)
        ref.flash_delta_kernel[(triton.cdiv(n, delta_block), b * h)](o, do, delta, n, d, BLOCK_M=delta_block,
                                                                     BLOCK_D=ref.block_d(d))
    tiles, launch = ref.flash_config("flash_dkdv", d)
    tiles = dkdv_tiles or tiles
    ref.flash_dkdv_kernel[(triton.cdiv(n, tiles["BLOCK_N"]), b * h)](
        q, k, v, do, lse, delta, dk, dv, n, d, 1 / math.sqrt(d), CAUSAL=causal, BLOCK_D=ref.block_d(d), **tiles,
        **launch)
    tiles, launch = ref.flash_config("flash_dq", d)
    tiles = dq_tiles or tiles
    ref.flash_dq_kernel[(dq_rows(n, tiles["BLOCK_M"]), b * h)](
        q, k, v, do, lse, delta, dq, n, d, 1 / math.sqrt(d), CAUSAL=causal, BLOCK_D=ref.block_d(d), **tiles,
        **launch)
    return dq, dk, dv


@triton.jit
def _dkdv_from_knobs(dk, dv, k, v, keys, q_head, do_head, lse_head, delta_head, lo, hi, n, sm_scale,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, d, BLOCK_D: tl.constexpr,
                     DV_BEFORE_MASK: tl.constexpr):
    """ref._dkdv_from with a knob: DV_BEFORE_MASK adds Pᵀ dO to dV before Pᵀ is masked."""
    cols = tl.arange(0, BLOCK_D)
    d_ok = cols[None, :] < d
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        tile = rows[:, None] * d + cols[None, :]
        load_ok = (rows[:, None] < n) & d_ok
        lse = tl.load(lse_head + rows, mask=rows < n, other=0.0)
        delta = tl.load(delta_head + rows, mask=rows < n, other=0.0)
        q = tl.load(q_head + tile, mask=load_ok, other=0.0)
        do = tl.load(do_head + tile, mask=load_ok, other=0.0)
        pt = tl.exp(tl.dot(k, tl.trans(q), input_precision="ieee") * sm_scale - lse[None, :])
        if DV_BEFORE_MASK:
            dv += tl.dot(pt.to(do.dtype), do, input_precision="ieee")
        if MASKED:
            valid = rows[None, :] < n
            if CAUSAL:
                valid = valid & (keys[:, None] <= rows[None, :])
            pt = tl.where(valid, pt, 0.0)
        if not DV_BEFORE_MASK:
            dv += tl.dot(pt.to(do.dtype), do, input_precision="ieee")
        dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(q.dtype), q, input_precision="ieee")
    return dk, dv


@triton.jit
def _dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, n, d, sm_scale,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 DV_BEFORE_MASK: tl.constexpr, DV_SCALED: tl.constexpr, SKIP_TAIL: tl.constexpr,
                 FROM_THE_END: tl.constexpr):
    """ref.flash_dkdv_kernel with knobs: DV_BEFORE_MASK (above); DV_SCALED stores dV * sm_scale, like dK; SKIP_TAIL
    never visits the ragged tail of query blocks; FROM_THE_END takes key blocks from the last (a right order)."""
    j = tl.program_id(0)
    if FROM_THE_END:
        j = tl.num_programs(0) - 1 - j
    start_n = j * BLOCK_N
    bh = tl.program_id(1)
    head = bh.to(tl.int64) * n * d
    stats = bh.to(tl.int64) * n
    keys = start_n + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    tile = keys[:, None] * d + cols[None, :]
    io_ok = (keys[:, None] < n) & (cols[None, :] < d)
    k = tl.load(k_ptr + head + tile, mask=io_ok, other=0.0)
    v = tl.load(v_ptr + head + tile, mask=io_ok, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    full = (n // BLOCK_M) * BLOCK_M
    tail = full
    if CAUSAL:
        below = start_n + BLOCK_N
        dk, dv = _dkdv_from_knobs(dk, dv, k, v, keys, q_ptr + head, do_ptr + head, lse_ptr + stats,
                                  delta_ptr + stats, start_n, below, n, sm_scale, True, CAUSAL, BLOCK_M, d, BLOCK_D,
                                  DV_BEFORE_MASK)
        dk, dv = _dkdv_from_knobs(dk, dv, k, v, keys, q_ptr + head, do_ptr + head, lse_ptr + stats,
                                  delta_ptr + stats, below, full, n, sm_scale, False, CAUSAL, BLOCK_M, d, BLOCK_D,
                                  DV_BEFORE_MASK)
        tail = tl.maximum(full, below)
    else:
        dk, dv = _dkdv_from_knobs(dk, dv, k, v, keys, q_ptr + head, do_ptr + head, lse_ptr + stats,
                                  delta_ptr + stats, 0, full, n, sm_scale, False, CAUSAL, BLOCK_M, d, BLOCK_D,
                                  DV_BEFORE_MASK)
    if not SKIP_TAIL:
        dk, dv = _dkdv_from_knobs(dk, dv, k, v, keys, q_ptr + head, do_ptr + head, lse_ptr + stats,
                                  delta_ptr + stats, tail, n, n, sm_scale, True, CAUSAL, BLOCK_M, d, BLOCK_D,
                                  DV_BEFORE_MASK)
    tl.store(dk_ptr + head + tile, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=io_ok)
    if DV_SCALED:
        dv = dv * sm_scale
    tl.store(dv_ptr + head + tile, dv.to(dv_ptr.dtype.element_ty), mask=io_ok)


def _backward_dkdv(do, q, k, v, o, lse, causal, dv_before_mask=False, dv_scaled=False, skip_tail=False,
                   from_the_end=False):
    """ref.flash_attention_backward with _dkdv_kernel's knobs for dK and dV (the reference's delta and dQ)."""
    ref.check_attention_inputs(q, k, v, ref.MAX_HEAD_DIM)
    b, h, n, d = q.shape
    q, k, v, o, do, lse = ref.heads_contiguous(q, k, v, o, do, lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = ref.flash_delta(o, do)
    tiles, launch = ref.flash_config("flash_dkdv", d)
    _dkdv_kernel[(triton.cdiv(n, tiles["BLOCK_N"]), b * h)](
        q, k, v, do, lse, delta, dk, dv, n, d, 1 / math.sqrt(d), CAUSAL=causal, BLOCK_D=ref.block_d(d),
        DV_BEFORE_MASK=dv_before_mask, DV_SCALED=dv_scaled, SKIP_TAIL=skip_tail, FROM_THE_END=from_the_end,
        **tiles, **launch)
    tiles, launch = ref.flash_config("flash_dq", d)
    ref.flash_dq_kernel[(triton.cdiv(n, tiles["BLOCK_M"]), b * h)](
        q, k, v, do, lse, delta, dq, n, d, 1 / math.sqrt(d), CAUSAL=causal, BLOCK_D=ref.block_d(d), **tiles,
        **launch)
    return dq, dk, dv


def backward_dv_before_mask(do, q, k, v, o, lse, causal=False):  # dV += Pᵀ dO before Pᵀ is masked: masked keys leak
    return _backward_dkdv(do, q, k, v, o, lse, causal, dv_before_mask=True)


def backward_dv_scaled(do, q, k, v, o, lse, causal=False):  # dV multiplied by the scale, as dK is
    return _backward_dkdv(do, q, k, v, o, lse, causal, dv_scaled=True)


def backward_dkdv_skips_tail(do, q, k, v, o, lse, causal=False):  # the ragged tail of query blocks never visited
    return _backward_dkdv(do, q, k, v, o, lse, causal, skip_tail=True)


def backward_dkdv_from_the_end(do, q, k, v, o, lse, causal=False):  # right: key blocks taken from the last
    return _backward_dkdv(do, q, k, v, o, lse, causal, from_the_end=True)


flash_delta = delta_of_do_only  # a learner's wrong step 1, called by name as the notebook's backward calls it


def backward_with_wrong_flash_delta(do, q, k, v, o, lse, causal=False):
    """Right for steps 2 and 3: the reference backward, calling this module's flash_delta (wrong) by name as a
    notebook's backward does; the backward checks put the course's flash_delta in its place, so only flash_delta's
    own check takes a point for it."""
    return _backward(do, q, k, v, o, lse, causal, delta=flash_delta(o, do))


def backward_dq_unscaled(do, q, k, v, o, lse, causal=False):  # dq stored without its * sm_scale (here: undone)
    dq, dk, dv = ref.flash_attention_backward(do, q, k, v, o, lse, causal)
    return dq * math.sqrt(q.shape[-1]), dk, dv


def backward_delta_zero(do, q, k, v, o, lse, causal=False):  # delta = 0: dS = P * dP, without the - rowsum(dO o)
    return _backward(do, q, k, v, o, lse, causal, delta=torch.zeros(lse.shape, device=q.device))


def backward_delta_of_do_only(do, q, k, v, o, lse, causal=False):  # delta = rowsum(dO), missing the * O
    return _backward(do, q, k, v, o, lse, causal, delta=do.float().sum(dim=-1))


def backward_dk_unscaled(do, q, k, v, o, lse, causal=False):  # dk stored without its * sm_scale (here: undone)
    dq, dk, dv = ref.flash_attention_backward(do, q, k, v, o, lse, causal)
    return dq, dk * math.sqrt(q.shape[-1]), dv


def backward_delta_in_torch(do, q, k, v, o, lse, causal=False):  # right numbers; delta from a full do * o product
    return _backward(do, q, k, v, o, lse, causal, delta=(do.float() * o.float()).sum(dim=-1))


def backward_dq_grid_floored(do, q, k, v, o, lse, causal=False):  # dq's grid floors: its tail rows never written
    return _backward(do, q, k, v, o, lse, causal, dq_rows=_floor)


def backward_other_tiles(do, q, k, v, o, lse, causal=False):  # right: other tiles for all three kernels
    return _backward(do, q, k, v, o, lse, causal, dkdv_tiles={"BLOCK_M": 16, "BLOCK_N": 64},
                     dq_tiles={"BLOCK_M": 64, "BLOCK_N": 16}, delta_block=16)


# ------------------------------------------------------------------------ autograd: numerics and memory
class _SavesP(torch.autograd.Function):  # keeps softmax(S), N x N per head, alive until backward
    @staticmethod
    def forward(ctx, q, k, v, causal):
        o, lse = ref.flash_attention_forward(q, k, v, causal)
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        ctx.save_for_backward(q, k, v, o, lse, torch.softmax(s, dim=-1))
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, _ = ctx.saved_tensors
        return *ref.flash_attention_backward(do, q, k, v, o, lse, ctx.causal), None


class _SwapsGrads(ref.FlashAttention):  # returns (dq, dv, dk): k and v get each other's gradient
    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ref.flash_attention_backward(do, q, k, v, o, lse, ctx.causal)
        return dq, dv, dk, None


class _OtherTiles(torch.autograd.Function):  # right: the tile-size alternatives above through autograd
    @staticmethod
    def forward(ctx, q, k, v, causal):
        o, lse = forward_other_tiles(q, k, v, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        return *backward_other_tiles(do, *ctx.saved_tensors, ctx.causal), None


def attention_saves_p(q, k, v, causal=False):
    return _SavesP.apply(q, k, v, causal)


def attention_swaps_dk_dv(q, k, v, causal=False):
    return _SwapsGrads.apply(q, k, v, causal)


def attention_other_tiles(q, k, v, causal=False):
    return _OtherTiles.apply(q, k, v, causal)
