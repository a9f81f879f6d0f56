"""Blind set for lesson 05_flash_attention: written from the exercise text alone (lessons/05_flash_attention.ipynb)."""
import math

import memfit  # noqa: F401  (before triton: on a machine without a GPU it selects Triton's interpreter)
import torch
import triton
import triton.language as tl

from memfit.from_lessons.flash_attention import (  # given helpers of the lesson (not exercises)
    LOG2E,
    MAX_HEAD_DIM,
    block_d,
    check_attention_inputs,
    flash_config,
    heads_contiguous,
)


# =============================================================================================
# Exercise 1: online softmax statistics
# =============================================================================================
def _neg_inf_to_zero(m):
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def _online_softmax_core(blocks, guard=True, fp32=True):
    m = l = None
    for x in blocks:
        if fp32:
            x = x.float()
        if m is None:
            m = torch.full((x.shape[0],), float("-inf"), dtype=x.dtype, device=x.device)
            l = torch.zeros((x.shape[0],), dtype=x.dtype, device=x.device)
        if x.shape[1] == 0:
            continue
        m_new = torch.maximum(m, x.amax(dim=1))
        m_sub = _neg_inf_to_zero(m_new) if guard else m_new
        l = l * torch.exp(m - m_sub) + torch.exp(x - m_sub[:, None]).sum(dim=1)
        m = m_new
    return m, l


def online_softmax_stats_ok(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference-style: running (m, l) updated per block, with the -inf guard."""
    return _online_softmax_core(blocks)


def online_softmax_stats_merge_blocks(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """RIGHT alternative: per-block (max, sum) first, then merge two (m, l) pairs symmetrically."""
    m = l = None
    for x in blocks:
        x = x.float()
        if m is None:
            m = torch.full((x.shape[0],), float("-inf"), device=x.device)
            l = torch.zeros((x.shape[0],), device=x.device)
        if x.shape[1] == 0:
            continue
        mb = x.amax(dim=1)
        lb = torch.exp(x - _neg_inf_to_zero(mb)[:, None]).sum(dim=1)
        m_new = torch.maximum(m, mb)
        ref = _neg_inf_to_zero(m_new)
        l = l * torch.exp(m - ref) + lb * torch.exp(mb - ref)
        m = m_new
    return m, l


def online_softmax_stats_unguarded(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """WRONG: no guard for m' = -inf (a row whose first block is fully masked gets NaN)."""
    return _online_softmax_core(blocks, guard=False)


def online_softmax_stats_two_pass(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """WRONG: a max pass then a sum pass over `blocks`: fine for a list/tuple, empty second pass for a generator."""
    m = None
    for x in blocks:
        bm = x.float().amax(dim=1)
        m = bm if m is None else torch.maximum(m, bm)
    l = torch.zeros_like(m)
    for x in blocks:
        l = l + torch.exp(x.float() - m[:, None]).sum(dim=1)
    return m, l


def online_softmax_stats_input_dtype(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """WRONG: works (and returns) in the blocks' dtype instead of fp32 (fp16 sums round / overflow)."""
    return _online_softmax_core(blocks, fp32=False)


def online_softmax_stats_global_max(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """WRONG: one running max for the whole matrix instead of per row (softmax still right, m is not the row max)."""
    m = l = None
    for x in blocks:
        x = x.float()
        if m is None:
            m = torch.tensor(float("-inf"), device=x.device)
            l = torch.zeros((x.shape[0],), device=x.device)
        m_new = torch.maximum(m, x.max())
        l = l * torch.exp(m - m_new) + torch.exp(x - m_new).sum(dim=1)
        m = m_new
    return m.expand_as(l).clone(), l


# =============================================================================================
# Exercise 2: tiled attention in PyTorch
# =============================================================================================
def _tiled_core(q, k, v, causal, block_m, block_n, *, bug=None, exp2=False):
    check_attention_inputs(q, k, v)
    b, h, n, d = q.shape
    scale = d ** -0.5
    if exp2:
        scale = scale * LOG2E
    fp32 = bug != "no_fp32"
    o = torch.empty_like(q)
    lse = torch.empty(b, h, n, dtype=q.dtype if bug == "lse_dtype" else torch.float32, device=q.device)
    for i0 in range(0, n, block_m):
        i1 = min(i0 + block_m, n)
        qi = q[:, :, i0:i1]
        qi = qi.float() if fp32 else qi
        dt = qi.dtype
        m = torch.full((b, h, i1 - i0), float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros((b, h, i1 - i0), dtype=dt, device=q.device)
        acc = torch.zeros((b, h, i1 - i0, d), dtype=dt, device=q.device)
        if causal:
            kend = min(i0 + block_n, n) if bug == "stop_block_n" else i1
        else:
            kend = n
        if bug == "ragged_drop":
            kend = (kend // block_n) * block_n if not causal else kend
        if bug == "row_panel":
            steps = [(0, kend)]
        else:
            steps = [(j0, min(j0 + block_n, kend)) for j0 in range(0, kend, block_n)]
        for j0, j1 in steps:
            kj = k[:, :, j0:j1]
            vj = v[:, :, j0:j1]
            if fp32:
                kj, vj = kj.float(), vj.float()
            s = (qi @ kj.transpose(-2, -1)) * scale
            if causal and j1 - 1 > i0:
                if bug == "local_index":
                    rows = torch.arange(i1 - i0, device=q.device)[:, None]
                    cols = torch.arange(j1 - j0, device=q.device)[None, :]
                    if j0 == (i0 // block_n) * block_n:  # "the diagonal tile"
                        s = s.masked_fill(cols > rows, float("-inf"))
                else:
                    rows = torch.arange(i0, i1, device=q.device)[:, None]
                    cols = torch.arange(j0, j1, device=q.device)[None, :]
                    s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_sub = _neg_inf_to_zero(m_new)
            if exp2:
                alpha = torch.exp2(m - m_sub)
                p = torch.exp2(s - m_sub[..., None])
            else:
                alpha = torch.exp(m - m_sub)
                p = torch.exp(s - m_sub[..., None])
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ vj
            m = m_new
        o[:, :, i0:i1] = (acc / l[..., None]).to(q.dtype)
        if exp2:
            lse[:, :, i0:i1] = ((m + torch.log2(l)) * math.log(2)).to(lse.dtype)
        else:
            lse[:, :, i0:i1] = (m + torch.log(l)).to(lse.dtype)
    return o, lse


def attention_tiled_ok(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """Reference-style tiled attention."""
    return _tiled_core(q, k, v, causal, block_m, block_n)


def attention_tiled_exp2(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """RIGHT alternative: the kernel's exp2 domain (scores scaled by log2e/sqrt(d)), lse converted back by ln 2."""
    return _tiled_core(q, k, v, causal, block_m, block_n, exp2=True)


def attention_tiled_causal_local_index(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """WRONG: causal mask from tile-local indices on one "diagonal" tile: right only when block_m == block_n."""
    return _tiled_core(q, k, v, causal, block_m, block_n, bug="local_index")


def attention_tiled_causal_stop_block_n(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """WRONG: a causal query block stops after block_n keys past its start, not at its last query."""
    return _tiled_core(q, k, v, causal, block_m, block_n, bug="stop_block_n")


def attention_tiled_ragged_drop(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """WRONG: non-causal inner loop over n // block_n full key blocks: the ragged last key block is dropped."""
    return _tiled_core(q, k, v, causal, block_m, block_n, bug="ragged_drop")


def attention_tiled_lse_dtype(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """WRONG: lse allocated in q's dtype (fp16 for fp16 inputs) instead of fp32."""
    return _tiled_core(q, k, v, causal, block_m, block_n, bug="lse_dtype")


def attention_tiled_no_fp32(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """WRONG: tiles are not cast to fp32: running m, l, acc live in the input dtype."""
    return _tiled_core(q, k, v, causal, block_m, block_n, bug="no_fp32")


def attention_tiled_row_panel(q, k, v, causal: bool = False, block_m: int = 64, block_n: int = 64):
    """WRONG (memory): one (block_m x N) score panel per query block instead of block_m x block_n tiles."""
    return _tiled_core(q, k, v, causal, block_m, block_n, bug="row_panel")


# =============================================================================================
# Exercise 3: the forward kernel
# =============================================================================================
# BUG codes of the forward kernel (0 = correct):
F_OK, F_LSE_LOG2, F_NO_DMASK, F_ZERO_PAD, F_ONE_LOOP, F_CAUSAL_STRICT = 0, 1, 2, 3, 4, 5


@triton.jit
def _attend_b(acc, l_i, m_i, q, k_head, v_head, rows, lo, hi, n, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, d,
              BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    if BUG == 2:
        dmask = offs_d < BLOCK_D
    else:
        dmask = offs_d < d
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if MASKED:
            kv_mask = (cols[:, None] < n) & dmask[None, :]
        else:
            kv_mask = (cols[:, None] >= 0) & dmask[None, :]
        kt = tl.load(k_head + cols[:, None] * d + offs_d[None, :], mask=kv_mask, other=0.0)
        vt = tl.load(v_head + cols[:, None] * d + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(kt), input_precision="ieee") * qk_scale
        if MASKED:
            if BUG == 3:
                valid = cols[None, :] >= 0
            else:
                valid = cols[None, :] < n
            if CAUSAL:
                if BUG == 5:
                    valid = valid & (cols[None, :] < rows[:, None])
                else:
                    valid = valid & (cols[None, :] <= rows[:, None])
            s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["n"])
def _flash_forward_kernel_b(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n, d, qk_scale,
                            CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    i = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * n * d
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if BUG == 2:
        dmask = offs_d < BLOCK_D
    else:
        dmask = offs_d < d
    row_mask = rows < n
    q = tl.load(q_ptr + base + rows[:, None] * d + offs_d[None, :], mask=row_mask[:, None] & dmask[None, :],
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_head = k_ptr + base
    v_head = v_ptr + base
    if BUG == 4:  # one masked loop over everything
        if CAUSAL:
            hi = tl.minimum((i + 1) * BLOCK_M, n)
        else:
            hi = n
        acc, l_i, m_i = _attend_b(acc, l_i, m_i, q, k_head, v_head, rows, 0, hi, n, qk_scale,
                                  True, CAUSAL, BLOCK_N, d, BLOCK_D, BUG)
    else:
        if CAUSAL:
            full_hi = i * BLOCK_M
            hi = tl.minimum((i + 1) * BLOCK_M, n)
        else:
            full_hi = (n // BLOCK_N) * BLOCK_N
            hi = n
        acc, l_i, m_i = _attend_b(acc, l_i, m_i, q, k_head, v_head, rows, 0, full_hi, n, qk_scale,
                                  False, CAUSAL, BLOCK_N, d, BLOCK_D, BUG)
        acc, l_i, m_i = _attend_b(acc, l_i, m_i, q, k_head, v_head, rows, full_hi, hi, n, qk_scale,
                                  True, CAUSAL, BLOCK_N, d, BLOCK_D, BUG)
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + rows[:, None] * d + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=row_mask[:, None] & (offs_d[None, :] < d))
    if BUG == 1:
        lse = m_i + tl.log2(l_i)
    else:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(lse_ptr + bh * n + rows, lse, mask=row_mask)


def _flash_forward_core(q, k, v, causal, *, bug=F_OK, tiles=None, out="ok"):
    check_attention_inputs(q, k, v, MAX_HEAD_DIM)
    b, h, n, d = q.shape
    o_strided = torch.empty_like(q) if out == "strided" else None
    if out == "clone":
        q, k, v = (t.contiguous().clone() for t in (q, k, v))
    else:
        q, k, v = heads_contiguous(q, k, v)
    if out == "fp32":
        o = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    elif o_strided is not None:
        o = o_strided
    else:
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    if n == 0 or b * h == 0:
        return o.to(q.dtype), lse
    cfg, opts = flash_config("flash_forward", d)
    if tiles is not None:
        cfg = tiles
    grid = (triton.cdiv(n, cfg["BLOCK_M"]), b * h)
    _flash_forward_kernel_b[grid](q, k, v, o, lse, n, d, d ** -0.5 * LOG2E, CAUSAL=causal,
                                  BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=block_d(d), BUG=bug,
                                  **opts)
    if out == "fp32":
        o = o.to(q.dtype)
    return o, lse


def flash_attention_forward_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """Reference-style forward kernel."""
    return _flash_forward_core(q, k, v, causal)


def flash_attention_forward_one_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """RIGHT alternative: one masked loop for every key block (slower, same values)."""
    return _flash_forward_core(q, k, v, causal, bug=F_ONE_LOOP)


def flash_attention_forward_big_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """RIGHT alternative: other tiles (64 x 32) than flash_config's."""
    return _flash_forward_core(q, k, v, causal, tiles=dict(BLOCK_M=64, BLOCK_N=32))


def flash_attention_forward_lse_log2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG: lse left in base 2 (no x ln 2 on the way out of the kernel); o is right."""
    return _flash_forward_core(q, k, v, causal, bug=F_LSE_LOG2)


def flash_attention_forward_no_dmask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG: no column mask on loads when BLOCK_D > d (d = 80, 96, ...): reads the next row's values."""
    return _flash_forward_core(q, k, v, causal, bug=F_NO_DMASK)


def flash_attention_forward_zero_pad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG: keys past n loaded as zeros but their scores not set to -inf (non-causal ragged last block)."""
    return _flash_forward_core(q, k, v, causal, bug=F_ZERO_PAD)


def flash_attention_forward_causal_strict(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG: causal mask keeps keys < query (strict) in the diagonal block: a query no longer sees itself."""
    return _flash_forward_core(q, k, v, causal, bug=F_CAUSAL_STRICT)


def flash_attention_forward_strided_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG: o = torch.empty_like(q) of the caller's (maybe transposed) q: kernel writes contiguous rows into it."""
    return _flash_forward_core(q, k, v, causal, out="strided")


def flash_attention_forward_clone_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG (memory): always q.contiguous().clone() etc. instead of heads_contiguous: three needless copies."""
    return _flash_forward_core(q, k, v, causal, out="clone")


def flash_attention_forward_fp32_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """WRONG (memory): o written in fp32 by the kernel and cast to q's dtype in PyTorch (extra copy for fp16)."""
    return _flash_forward_core(q, k, v, causal, out="fp32")


# =============================================================================================
# Exercise 4: the backward kernels
# =============================================================================================
# BUG codes of the backward kernels (0 = correct)
B_OK, B_NO_DK_SCALE, B_DIAG_ONE_QBLOCK, B_DV_BEFORE_MASK, B_ONE_LOOP, B_DELTA_HALF = 0, 1, 2, 3, 4, 5


@triton.jit(do_not_specialize=["n"])
def _flash_delta_kernel_b(o_ptr, do_ptr, delta_ptr, n, d, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                          BUG: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n) & (offs_d[None, :] < d)
    ptrs = bh * n * d + rows[:, None] * d + offs_d[None, :]
    o = tl.load(o_ptr + ptrs, mask=mask, other=0.0)
    do = tl.load(do_ptr + ptrs, mask=mask, other=0.0)
    if BUG == 5:
        prod = (o * do).to(o.dtype)
        delta = tl.sum(prod, 1).to(o.dtype).to(tl.float32)
    else:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + bh * n + rows, delta, mask=rows < n)


@triton.jit
def _dkdv_from_b(dk, dv, k, v, keys, q_head, do_head, lse_head, delta_head, lo, hi, n, sm_scale,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, d,
                 BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < d
    for start in range(lo, hi, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        rmask = rows < n
        ld = rmask[:, None] & dmask[None, :]
        q = tl.load(q_head + rows[:, None] * d + offs_d[None, :], mask=ld, other=0.0)
        do = tl.load(do_head + rows[:, None] * d + offs_d[None, :], mask=ld, other=0.0)
        lse = tl.load(lse_head + rows, mask=rmask, other=0.0)
        delta = tl.load(delta_head + rows, mask=rmask, other=0.0)
        st = tl.dot(k, tl.trans(q), input_precision="ieee") * sm_scale  # (keys, queries)
        pt = tl.exp(st - lse[None, :])
        if BUG == 3:
            dv += tl.dot(pt.to(do.dtype), do, input_precision="ieee")
        if MASKED:
            valid = rows[None, :] < n
            if CAUSAL:
                valid = valid & (keys[:, None] <= rows[None, :])
            pt = tl.where(valid, pt, 0.0)
        if BUG != 3:
            dv += tl.dot(pt.to(do.dtype), do, input_precision="ieee")
        dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(q.dtype), q, input_precision="ieee")
    return dk, dv


@triton.jit(do_not_specialize=["n"])
def _flash_dkdv_kernel_b(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, n, d, sm_scale,
                         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    j = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * n * d
    keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kmask = (keys[:, None] < n) & (offs_d[None, :] < d)
    k = tl.load(k_ptr + base + keys[:, None] * d + offs_d[None, :], mask=kmask, other=0.0)
    v = tl.load(v_ptr + base + keys[:, None] * d + offs_d[None, :], mask=kmask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    q_head = q_ptr + base
    do_head = do_ptr + base
    lse_head = lse_ptr + bh * n
    delta_head = delta_ptr + bh * n
    n_full = (n // BLOCK_M) * BLOCK_M
    if BUG == 4:
        lo = 0
        if CAUSAL:
            lo = j * BLOCK_N
        dk, dv = _dkdv_from_b(dk, dv, k, v, keys, q_head, do_head, lse_head, delta_head, lo, n, n, sm_scale,
                              True, CAUSAL, BLOCK_M, d, BLOCK_D, BUG)
    else:
        if CAUSAL:
            diag_lo = j * BLOCK_N
            if BUG == 2:
                diag_hi = diag_lo + BLOCK_M
            else:
                diag_hi = diag_lo + BLOCK_N
            dk, dv = _dkdv_from_b(dk, dv, k, v, keys, q_head, do_head, lse_head, delta_head, diag_lo, diag_hi, n,
                                  sm_scale, True, CAUSAL, BLOCK_M, d, BLOCK_D, BUG)
            lo = diag_hi
        else:
            lo = 0
        mid_hi = tl.maximum(n_full, lo)
        dk, dv = _dkdv_from_b(dk, dv, k, v, keys, q_head, do_head, lse_head, delta_head, lo, mid_hi, n, sm_scale,
                              False, CAUSAL, BLOCK_M, d, BLOCK_D, BUG)
        dk, dv = _dkdv_from_b(dk, dv, k, v, keys, q_head, do_head, lse_head, delta_head, mid_hi, n, n, sm_scale,
                              True, CAUSAL, BLOCK_M, d, BLOCK_D, BUG)
    if BUG != 1:
        dk = dk * sm_scale
    tl.store(dk_ptr + base + keys[:, None] * d + offs_d[None, :], dk.to(dk_ptr.dtype.element_ty), mask=kmask)
    tl.store(dv_ptr + base + keys[:, None] * d + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty), mask=kmask)


@triton.jit
def _dq_from_b(dq, q, do, lse, delta, rows, k_head, v_head, lo, hi, n, sm_scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, d,
               BLOCK_D: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < d
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ld = (cols[:, None] < n) & dmask[None, :]
        kt = tl.load(k_head + cols[:, None] * d + offs_d[None, :], mask=ld, other=0.0)
        vt = tl.load(v_head + cols[:, None] * d + offs_d[None, :], mask=ld, other=0.0)
        s = tl.dot(q, tl.trans(kt), input_precision="ieee") * sm_scale
        p = tl.exp(s - lse[:, None])
        if MASKED:
            valid = cols[None, :] < n
            if CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None])
            p = tl.where(valid, p, 0.0)
        dp = tl.dot(do, tl.trans(vt), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), kt, input_precision="ieee")
    return dq


@triton.jit(do_not_specialize=["n"])
def _flash_dq_kernel_b(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, n, d, sm_scale,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BUG: tl.constexpr):
    i = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * n * d
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    rmask = rows < n
    ld = rmask[:, None] & (offs_d[None, :] < d)
    q = tl.load(q_ptr + base + rows[:, None] * d + offs_d[None, :], mask=ld, other=0.0)
    do = tl.load(do_ptr + base + rows[:, None] * d + offs_d[None, :], mask=ld, other=0.0)
    lse = tl.load(lse_ptr + bh * n + rows, mask=rmask, other=0.0)
    delta = tl.load(delta_ptr + bh * n + rows, mask=rmask, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_head = k_ptr + base
    v_head = v_ptr + base
    if BUG == 4:
        if CAUSAL:
            hi = tl.minimum((i + 1) * BLOCK_M, n)
        else:
            hi = n
        dq = _dq_from_b(dq, q, do, lse, delta, rows, k_head, v_head, 0, hi, n, sm_scale,
                        True, CAUSAL, BLOCK_N, d, BLOCK_D)
    else:
        if CAUSAL:
            full_hi = i * BLOCK_M
            hi = tl.minimum((i + 1) * BLOCK_M, n)
        else:
            full_hi = (n // BLOCK_N) * BLOCK_N
            hi = n
        dq = _dq_from_b(dq, q, do, lse, delta, rows, k_head, v_head, 0, full_hi, n, sm_scale,
                        False, CAUSAL, BLOCK_N, d, BLOCK_D)
        dq = _dq_from_b(dq, q, do, lse, delta, rows, k_head, v_head, full_hi, hi, n, sm_scale,
                        True, CAUSAL, BLOCK_N, d, BLOCK_D)
    dq = dq * sm_scale
    tl.store(dq_ptr + base + rows[:, None] * d + offs_d[None, :], dq.to(dq_ptr.dtype.element_ty), mask=ld)


def _flash_backward_core(do, q, k, v, o, lse, causal, *, bug=B_OK, mode="ok", tiles=None):
    check_attention_inputs(q, k, v, MAX_HEAD_DIM)
    if do.shape != q.shape or o.shape != q.shape or lse.shape != q.shape[:3] or lse.dtype != torch.float32:
        raise ValueError(f"do and o must have q's shape {tuple(q.shape)} and lse fp32 of shape {tuple(q.shape[:3])}")
    b, h, n, d = q.shape
    if mode == "strided":
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if mode == "do_as_is":
        q, k, v, o, lse = heads_contiguous(q, k, v, o, lse)
    else:
        q, k, v, o, do, lse = heads_contiguous(q, k, v, o, do, lse)
    if mode != "strided":
        dq, dk, dv = (torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    if n == 0 or b * h == 0:
        return dq, dk, dv
    BLOCK_D = block_d(d)
    sm_scale = d ** -0.5
    if mode == "torch_delta":
        delta = (do.float() * o.float()).sum(-1)
    else:
        delta = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
        cfg_d, _ = flash_config("flash_dq", d)
        rows_per_program = cfg_d["BLOCK_M"]
        if mode == "delta_grid":  # grid from the dK/dV key block, program size from its query block
            cfg_d, _ = flash_config("flash_dkdv", d)
            rows_per_program = cfg_d["BLOCK_N"]
        _flash_delta_kernel_b[(triton.cdiv(n, rows_per_program), b * h)](
            o, do, delta, n, d, BLOCK_M=cfg_d["BLOCK_M"], BLOCK_D=BLOCK_D, BUG=bug)
    cfg, opts = flash_config("flash_dkdv", d)
    if tiles is not None:
        cfg = tiles["dkdv"]
    _flash_dkdv_kernel_b[(triton.cdiv(n, cfg["BLOCK_N"]), b * h)](
        q, k, v, do, lse, delta, dk, dv, n, d, sm_scale, CAUSAL=causal, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_D=BLOCK_D, BUG=bug, **opts)
    cfg, opts = flash_config("flash_dq", d)
    if tiles is not None:
        cfg = tiles["dq"]
    _flash_dq_kernel_b[(triton.cdiv(n, cfg["BLOCK_M"]), b * h)](
        q, k, v, do, lse, delta, dq, n, d, sm_scale, CAUSAL=causal, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_D=BLOCK_D, BUG=bug, **opts)
    return dq, dk, dv


def flash_attention_backward_ok(do, q, k, v, o, lse, causal: bool = False):
    """Reference-style backward (three kernels)."""
    return _flash_backward_core(do, q, k, v, o, lse, causal)


def flash_attention_backward_one_loop(do, q, k, v, o, lse, causal: bool = False):
    """RIGHT alternative: every block through the masked helpers (no mask split)."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, bug=B_ONE_LOOP)


def flash_attention_backward_square_tiles(do, q, k, v, o, lse, causal: bool = False):
    """RIGHT alternative: 32 x 32 tiles for both dK/dV and dQ instead of flash_config's."""
    t = dict(BLOCK_M=32, BLOCK_N=32)
    return _flash_backward_core(do, q, k, v, o, lse, causal, tiles=dict(dkdv=t, dq=t))


def flash_attention_backward_no_dk_scale(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: dK left "before its scale": the final x sm_scale forgotten for dK (dQ has it)."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, bug=B_NO_DK_SCALE)


def flash_attention_backward_diag_one_qblock(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: causal dK/dV masks only ONE query block (BLOCK_M) at the diagonal, not the whole key block (BLOCK_N)."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, bug=B_DIAG_ONE_QBLOCK)


def flash_attention_backward_dv_before_mask(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: dV accumulated from P^T before the mask is applied (future keys leak into dV)."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, bug=B_DV_BEFORE_MASK)


def flash_attention_backward_delta_half(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: delta = rowsum(dO * O) summed and stored through the input dtype (fp16), not in fp32."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, bug=B_DELTA_HALF)


def flash_attention_backward_delta_grid(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: delta's grid counted in dK/dV key blocks (BLOCK_N) while each program covers BLOCK_M rows: rows missed."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, mode="delta_grid")


def flash_attention_backward_do_as_is(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: heads_contiguous on q, k, v, o but not on dO: a transposed dO is read as if contiguous."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, mode="do_as_is")


def flash_attention_backward_strided_out(do, q, k, v, o, lse, causal: bool = False):
    """WRONG: dq/dk/dv = torch.empty_like of the caller's (maybe transposed) q, k, v: kernels write contiguous rows."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, mode="strided")


def flash_attention_backward_torch_delta(do, q, k, v, o, lse, causal: bool = False):
    """WRONG (memory): delta in PyTorch from fp32 copies of dO and O (two N x d fp32 temporaries)."""
    return _flash_backward_core(do, q, k, v, o, lse, causal, mode="torch_delta")


# =============================================================================================
# Section 6: the differentiable op (given glue, rebuilt around each forward/backward variant)
# =============================================================================================
def _make_function(forward, backward, save_o_fp32=False):
    class _Flash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            o, lse = forward(q, k, v, causal)
            ctx.save_for_backward(q, k, v, o.float() if save_o_fp32 else o, lse)
            ctx.causal = causal
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = backward(do, q, k, v, o, lse, ctx.causal)
            return dq, dk, dv, None

    return _Flash


_FlashOk = _make_function(flash_attention_forward_ok, flash_attention_backward_ok)
_FlashAlt = _make_function(flash_attention_forward_big_tiles, flash_attention_backward_square_tiles)
_FlashSaveOFp32 = _make_function(flash_attention_forward_ok, flash_attention_backward_ok, save_o_fp32=True)
_FlashTorchDelta = _make_function(flash_attention_forward_ok, flash_attention_backward_torch_delta)
_FlashDoAsIs = _make_function(flash_attention_forward_ok, flash_attention_backward_do_as_is)
_FlashCloneInputs = _make_function(flash_attention_forward_clone_inputs, flash_attention_backward_ok)
_FlashNoDkScale = _make_function(flash_attention_forward_ok, flash_attention_backward_no_dk_scale)


def flash_attention_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Reference-style differentiable op from the _ok kernels."""
    return _FlashOk.apply(q, k, v, causal)


def flash_attention_alt_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """RIGHT alternative: the op built from the other-tile forward and backward."""
    return _FlashAlt.apply(q, k, v, causal)


def flash_attention_save_o_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               causal: bool = False) -> torch.Tensor:
    """WRONG (memory): forward saves o.float() "for an fp32 delta": an extra fp32 copy of o for fp16 inputs."""
    return _FlashSaveOFp32.apply(q, k, v, causal)


def flash_attention_torch_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                causal: bool = False) -> torch.Tensor:
    """WRONG (memory): backward computes delta in PyTorch through fp32 copies of dO and O."""
    return _FlashTorchDelta.apply(q, k, v, causal)


def flash_attention_do_as_is(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """WRONG: backward does not make dO contiguous (transposed-layout training gets wrong gradients)."""
    return _FlashDoAsIs.apply(q, k, v, causal)


def flash_attention_clone_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 causal: bool = False) -> torch.Tensor:
    """WRONG (memory): forward clones q, k, v every call."""
    return _FlashCloneInputs.apply(q, k, v, causal)


def flash_attention_no_dk_scale(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                causal: bool = False) -> torch.Tensor:
    """WRONG: the op over the backward that forgets dK's scale."""
    return _FlashNoDkScale.apply(q, k, v, causal)


class _FlashSavesP(torch.autograd.Function):
    """Forward by the kernel, backward in PyTorch from a recomputed full P (N x N per head)."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        o, lse = flash_attention_forward_ok(q, k, v, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        qf, kf, vf, dof, of = (t.float() for t in (q, k, v, do, o))
        s = (qf @ kf.transpose(-2, -1)) * scale
        if ctx.causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        p = torch.exp(s - lse[..., None])
        dv = p.transpose(-2, -1) @ dof
        dp = dof @ vf.transpose(-2, -1)
        ds = p * (dp - (dof * of).sum(-1, keepdim=True))
        dq = scale * ds @ kf
        dk = scale * ds.transpose(-2, -1) @ qf
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def flash_attention_torch_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   causal: bool = False) -> torch.Tensor:
    """WRONG (memory): backward recomputes the whole N x N P in PyTorch (right gradients, quadratic memory)."""
    return _FlashSavesP.apply(q, k, v, causal)


BLIND = {
    "online_softmax": {
        "wrong": ["online_softmax_stats_unguarded", "online_softmax_stats_two_pass",
                  "online_softmax_stats_input_dtype", "online_softmax_stats_global_max"],
        "right": ["online_softmax_stats_merge_blocks"],
    },
    "attention_tiled": {
        "wrong": ["attention_tiled_causal_local_index", "attention_tiled_causal_stop_block_n",
                  "attention_tiled_ragged_drop", "attention_tiled_lse_dtype", "attention_tiled_no_fp32",
                  "attention_tiled_row_panel"],
        "right": ["attention_tiled_exp2"],
    },
    "flash_forward": {
        "wrong": ["flash_attention_forward_lse_log2", "flash_attention_forward_no_dmask",
                  "flash_attention_forward_zero_pad", "flash_attention_forward_causal_strict",
                  "flash_attention_forward_strided_out"],
        "right": ["flash_attention_forward_one_loop", "flash_attention_forward_big_tiles"],
    },
    "flash_forward_memory": {
        "wrong": ["flash_attention_forward_clone_inputs", "flash_attention_forward_fp32_out"],
        "right": ["flash_attention_forward_one_loop", "flash_attention_forward_big_tiles"],
    },
    # exercise 4's one check became three (flash_delta, flash_backward_dv, flash_backward): each entry of the old
    # flash_backward stands where its mistake shows, dv (flash_backward_dv) or dk and dq (flash_backward), or both
    "flash_backward_dv": {
        "wrong": ["flash_attention_backward_diag_one_qblock", "flash_attention_backward_dv_before_mask",
                  "flash_attention_backward_do_as_is", "flash_attention_backward_strided_out"],
        "right": ["flash_attention_backward_one_loop", "flash_attention_backward_square_tiles"],
    },
    "flash_backward": {
        "wrong": ["flash_attention_backward_no_dk_scale", "flash_attention_backward_diag_one_qblock",
                  "flash_attention_backward_delta_half", "flash_attention_backward_delta_grid",
                  "flash_attention_backward_do_as_is", "flash_attention_backward_strided_out"],
        "right": ["flash_attention_backward_one_loop", "flash_attention_backward_square_tiles"],
    },
    "flash_attention_memory": {
        "wrong": ["flash_attention_save_o_fp32", "flash_attention_torch_delta", "flash_attention_do_as_is",
                  "flash_attention_clone_inputs", "flash_attention_no_dk_scale", "flash_attention_torch_backward"],
        "right": ["flash_attention_alt_tiles"],
    },
}

WHY = {
    "online_softmax_stats_unguarded": "no 'subtract 0 instead of m' while m' is still -inf' guard: a row whose first "
                                      "block is all -inf gets NaN (the text's 'One trap')",
    "online_softmax_stats_two_pass": "max pass then sum pass over `blocks`: 'yields ... once (it may be a generator: "
                                     "you cannot go back)'",
    "online_softmax_stats_input_dtype": "computes and returns (m, l) in the blocks' dtype: 'Return (m, l), fp32 tensors'",
    "online_softmax_stats_global_max": "one max over the whole matrix: m must be 'the row maximum', shape (rows,)",
    "attention_tiled_causal_local_index": "causal mask from tile-local row/col indices on one tile: only right when "
                                          "block_m == block_n (non-default block sizes)",
    "attention_tiled_causal_stop_block_n": "causal query block stops at start + block_n, not at its last query "
                                           "('a query block stops at the diagonal'); hides when block_m <= block_n",
    "attention_tiled_ragged_drop": "inner loop over n // block_n key blocks: N not a multiple of block_n drops keys",
    "attention_tiled_lse_dtype": "lse in q's dtype: 'lse fp32 of shape (B, H, N)'",
    "attention_tiled_no_fp32": "m, l, acc in the input dtype: 'Work in fp32 inside (cast each tile)'",
    "attention_tiled_row_panel": "scores for a whole block_m x N row panel at once: 'S and P exist for one "
                                 "(block_m x block_n) tile at a time' (memory)",
    "flash_attention_forward_lse_log2": "lse not converted back: 'the logsumexp leaves the kernel converted back to "
                                        "natural log (x ln 2)'",
    "flash_attention_forward_no_dmask": "no column mask when BLOCK_D > d: 'with a mask on the columns for d = 80 or 96'",
    "flash_attention_forward_zero_pad": "keys past n zero-loaded but not masked to -inf in the ragged block: 'keys at "
                                        "or past n ... are masked'",
    "flash_attention_forward_causal_strict": "causal mask cols < rows excludes the diagonal: 'query i sees keys 0..i'",
    "flash_attention_forward_strided_out": "o = empty_like(original q) keeps a transposed layout while the kernel "
                                           "writes contiguous (B*H, N, d) rows ('make inputs contiguous')",
    "flash_attention_forward_clone_inputs": "copies q, k, v on every call instead of heads_contiguous's 'a copy only "
                                            "for tensors that are not laid out so' (memory)",
    "flash_attention_forward_fp32_out": "fp32 o then .to(dtype) in PyTorch: an extra output-sized buffer (memory)",
    "flash_attention_backward_no_dk_scale": "dK 'before its scale' never scaled: dK = scale * dS^T Q",
    "flash_attention_backward_diag_one_qblock": "causal dK/dV: masked diagonal covers one BLOCK_M of queries, not the "
                                                "key block ('a key block is a multiple of the query block')",
    "flash_attention_backward_dv_before_mask": "dV += P^T dO before P^T is masked: 'mask P^T in masked blocks'",
    "flash_attention_backward_delta_half": "Delta summed/stored through fp16: 'Delta = rowsum(dO * O), fp32'",
    "flash_attention_backward_delta_grid": "delta kernel launched over cdiv(n, dkdv BLOCK_N) programs of dkdv BLOCK_M "
                                           "rows: 'one value per row' left uninitialised for some rows (mixing tiles)",
    "flash_attention_backward_do_as_is": "heads_contiguous skipped for dO: kernels address contiguous (B*H, N, d) rows",
    "flash_attention_backward_strided_out": "dq/dk/dv = empty_like(transposed input) while kernels write contiguous rows",
    "flash_attention_save_o_fp32": "forward saves o.float() beside the returned o (fp16 inputs: an fp32 copy kept "
                                   "to backward): 'Forward saves q, k, v ..., o and the logsumexp' (memory)",
    "flash_attention_torch_delta": "Delta in PyTorch via fp32 copies of dO and O: budget is o, lse, Delta, dQ, dK, dV",
    "flash_attention_do_as_is": "dO not made contiguous: wrong gradients in the transposed (B, N, H, d) layout",
    "flash_attention_clone_inputs": "forward clones q, k, v each call: extra memory beyond the budget",
    "flash_attention_no_dk_scale": "the op over a backward that forgets dK's scale: wrong gradients",
    "flash_attention_torch_backward": "backward recomputes the whole N x N P in PyTorch: 'Nothing N x N was kept, so "
                                      "P is recomputed, tile by tile' (memory)",
}
