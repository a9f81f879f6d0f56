"""Blind set for lesson 09_parallelism, exercises 5-8: written from the exercise text alone
(lessons/09_parallelism.ipynb, memfit/parallel.py, memfit/zero.py, memfit/gpt.py)."""
import memfit  # noqa: F401  (first: it decides TRITON_INTERPRET before triton is imported)

import heapq
import itertools
import math

import torch

from memfit.parallel import attention_with_lse, attention_with_lse_backward, layout_cost, stage_params


# =============================================================================================== helpers

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _powers_of_two(limit: int):
    n = 1
    while n <= limit:
        yield n
        n *= 2


def _chunk_pairs(rank: int, src: int, cp: int, c: int):
    """As the notebook gives it: (query rows, key rows, causal) of each pair of chunks that attend."""
    mine, theirs = (rank, 2 * cp - 1 - rank), (src, 2 * cp - 1 - src)
    for i, qc in enumerate(mine):
        for j, kc in enumerate(theirs):
            if kc <= qc:
                yield slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c), kc == qc


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.permute(1, 2, 0, 3)  # (seq, batch, heads, d) -> (batch, heads, seq, d), a view


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


# ---------------------------------------------------------------- exercise 4 (helper, not graded here)

def tp_activation_bytes(cfg, seq: int, batch: int, tp: int, sequence_parallel: bool, recompute: str = "none",
                        dtype_bytes: int = 2) -> int:
    """Helper (exercise 4, per its table): bytes one rank keeps in one tp_block."""
    if recompute not in ("none", "full"):
        raise ValueError(f"recompute must be 'none' or 'full', got {recompute!r}")
    if tp < 1 or cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
        raise ValueError(f"tp={tp} must divide n_heads, n_kv_heads and ffn_hidden")
    if sequence_parallel and seq % tp:
        raise ValueError(f"seq={seq} is not a multiple of tp={tp}")
    h = cfg.d_model
    T = seq * batch
    L = T // tp if sequence_parallel else T
    if recompute == "full":
        return dtype_bytes * L * h
    q, f = cfg.q_dim // tp, cfg.ffn_hidden // tp
    elements = 2 * L * h + 2 * (L + L * h) + 2 * T * h + 4 * T * q + 4 * T * f
    return dtype_bytes * elements + 4 * (T * cfg.n_heads // tp)


# ---------------------------------------------------------------- exercise 7 (helper for exercise 8)

def memory_per_gpu(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute):
    """Helper (exercise 7 per its text), called by the planner entries; the grader swaps in the reference."""
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0-3, got {zero}")
    if min(seq_len, micro_batch, n_micro, tp, pp, cp, dp) < 1:
        raise ValueError("sizes must be at least 1")
    if pp > cfg.n_layers:
        raise ValueError("pp above n_layers")
    if cp > 1 and seq_len % (2 * cp):
        raise ValueError("seq_len must be a multiple of 2 * cp")
    psi = stage_params(cfg, tp, pp)
    shard = _ceil_div(psi, dp * cp)
    out = {"params": 2 * (shard if zero >= 3 else psi), "grads": 2 * (shard if zero >= 2 else psi),
           "optimizer": 12 * (shard if zero >= 1 else psi)}
    layers = _ceil_div(cfg.n_layers, pp)
    local = seq_len // cp
    acts = min(pp, n_micro) * layers * tp_activation_bytes(cfg, local, micro_batch, tp, True, recompute)
    if recompute == "full":
        acts += tp_activation_bytes(cfg, local, micro_batch, tp, True, "none")
    out["activations"] = acts
    out["total"] = sum(out.values())
    return out


# ======================================================================================= ring_attention
# The wrong entries below share one configurable ring (a learner's code with one mistake each); the right entries
# are the plain ring (_RingBase as is) and two independently written rings.

def _pairs(mode: str, rank: int, src: int, cp: int, c: int):
    if mode == "right":
        yield from _chunk_pairs(rank, src, cp, c)
    elif mode == "no_causal":  # every pair unmasked, the diagonal one too
        for qr, kr, _ in _chunk_pairs(rank, src, cp, c):
            yield qr, kr, False
    elif mode == "all_chunks":  # no chunk-level causality: every held key chunk, the own chunk causal
        for i in range(2):
            for j in range(2):
                yield slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c), src == rank and i == j
    elif mode == "contiguous":  # assumes rank r holds tokens r·n … (r+1)·n − 1 (no zigzag)
        n = 2 * c
        if src < rank:
            yield slice(0, n), slice(0, n), False
        elif src == rank:
            yield slice(0, n), slice(0, n), True
    elif mode == "causal_by_index":  # causal = (i == j), the position in the pair, instead of kc == qc
        mine, theirs = (rank, 2 * cp - 1 - rank), (src, 2 * cp - 1 - src)
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                if kc <= qc:
                    yield slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c), i == j
    elif mode == "theirs_wrong":  # the source's second chunk taken as 2cp-1-rank
        mine, theirs = (rank, 2 * cp - 1 - rank), (src, 2 * cp - 1 - rank)
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                if kc <= qc:
                    yield slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c), kc == qc
    else:
        raise AssertionError(mode)


def _naive_attention_with_lse(q, k, v, causal):
    """The whole score matrix of the pair at once (no query tiles)."""
    wide = _acc_dtype(q.dtype)
    s = (q.to(wide) @ k.to(wide).transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.to(wide)).to(q.dtype), lse


def _naive_attention_with_lse_backward(q, k, v, out, dout, lse, causal):
    wide = _acc_dtype(q.dtype)
    scale = q.shape[-1] ** -0.5
    qw, kw, vw, dow = q.to(wide), k.to(wide), v.to(wide), dout.to(wide)
    s = (qw @ kw.transpose(-2, -1)) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-2, -1) @ dow
    delta = (dow * out.to(wide)).sum(-1)
    ds = p * (dow @ vw.transpose(-2, -1) - delta[..., None])
    return (ds @ kw * scale).to(q.dtype), (ds.transpose(-2, -1) @ qw * scale).to(k.dtype), dv.to(v.dtype)


def _check_qkv(q, k, v, check_shape=True, check_odd=True):
    if q.dim() != 4 or (check_shape and (k.shape != q.shape or v.shape != q.shape)):
        raise ValueError(f"q, k, v must be 4-D of one shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if check_odd and q.shape[0] % 2:
        raise ValueError(f"seq_local={q.shape[0]} must be even (two chunks per rank)")


class _RingBase(torch.autograd.Function):
    """The plain ring: K/V passed cp - 1 times forward and backward, dK/dV (fp32) cp times, travelling with K/V."""
    pairs = "right"
    bwd_pairs = None  # None: as forward
    src_sign = -1  # what a rank holds at step t came from rank - t
    merge = "right"
    fwd_native = False  # forward's accumulators in q's dtype
    dq_native = False
    dkv_native = False
    out_fp32 = False
    block_lse = False
    fwd_extra_pass = False
    fwd_short = False
    dkv = "travel"  # "travel": passed with K/V each step; "tail": cp - 1 passes after the loop; "stationary"
    bwd_pass_kv = True
    save_all = False
    gather = False
    layout_bug = False
    attn = staticmethod(attention_with_lse)
    attn_bwd = staticmethod(attention_with_lse_backward)

    @classmethod
    def _view(cls, t):
        return t.transpose(1, 2) if cls.layout_bug else _heads_first(t)

    @classmethod
    def _unview(cls, t):
        return t.transpose(1, 2) if cls.layout_bug else t.permute(2, 0, 1, 3)

    @classmethod
    def _src(cls, rank, step, cp):
        return (rank + cls.src_sign * step) % cp

    @classmethod
    def _merge_into(cls, out, lse, rows, o, l):
        old = lse[..., rows]
        l = l.to(lse.dtype)
        o = o.to(out.dtype)
        if cls.merge == "max":  # lse = max(lse, l): not the log of the summed weights
            new = torch.maximum(old, l)
        else:
            new = torch.logaddexp(old, l)
        if cls.merge == "no_rescale":
            out[..., rows, :] = out[..., rows, :] + o * torch.exp(l - new)[..., None]
        else:
            out[..., rows, :] = out[..., rows, :] * torch.exp(old - new)[..., None] + o * torch.exp(l - new)[..., None]
        lse[..., rows] = new

    @classmethod
    def _gather(cls, comm, t):
        full = torch.empty((comm.world_size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
        comm.all_gather(full, t.contiguous())
        return full

    @classmethod
    def make(cls, name, **opts):
        """A subclass with `opts`: forward and backward bound to it."""
        sub = type(name, (cls,), dict(opts))

        def forward(ctx, q, k, v, comm):
            return sub._fwd(ctx, q, k, v, comm)

        def backward(ctx, dout):
            return sub._bwd(ctx, dout)
        sub.forward = staticmethod(forward)
        sub.backward = staticmethod(backward)
        return sub

    @classmethod
    def _fwd(cls, ctx, q, k, v, comm):
        cp, rank = comm.world_size, comm.rank
        c = q.shape[0] // 2
        acc = q.dtype if cls.fwd_native else _acc_dtype(q.dtype)
        qh = cls._view(q)
        out = torch.zeros(qh.shape, dtype=acc, device=q.device)
        lse = torch.full(qh.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        kc, vc = k.contiguous(), v.contiguous()
        if cls.gather:
            kall, vall = cls._gather(comm, kc), cls._gather(comm, vc)
        kept = []
        for step in range(cp - 1 if cls.fwd_short else cp):
            src = cls._src(rank, step, cp)
            if cls.gather:
                kc, vc = kall[src], vall[src]
            if cls.save_all:
                kept.append((kc, vc))
            kh, vh = cls._view(kc), cls._view(vc)
            for qr, kr, causal in _pairs(cls.pairs, rank, src, cp, c):
                o, l = cls.attn(qh[..., qr, :], kh[..., kr, :], vh[..., kr, :], causal)
                cls._merge_into(out, lse, qr, o, l)
                del o, l
            del kh, vh
            if not cls.gather and (step < cp - 1 or cls.fwd_extra_pass):
                kc = comm.ring_pass(kc)
                vc = comm.ring_pass(vc)
        del kc, vc
        if cls.gather:
            del kall, vall
        ctx.comm = comm
        ctx.kept = kept
        ctx.save_for_backward(q, k, v, out, lse)
        result = torch.empty(q.shape, dtype=acc if cls.out_fp32 else q.dtype, device=q.device)
        result.copy_(cls._unview(out))
        return result

    @classmethod
    def _bwd(cls, ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm = ctx.comm
        cp, rank = comm.world_size, comm.rank
        c = q.shape[0] // 2
        acc = _acc_dtype(q.dtype)
        qh, doh = cls._view(q), cls._view(dout)
        dq = torch.zeros(qh.shape, dtype=q.dtype if cls.dq_native else acc, device=q.device)
        gacc = k.dtype if cls.dkv_native else acc
        kc, vc = k.contiguous(), v.contiguous()
        if cls.gather:
            kall, vall = cls._gather(comm, kc), cls._gather(comm, vc)
            dkall = torch.zeros(kall.shape, dtype=gacc, device=q.device)
            dvall = torch.zeros(vall.shape, dtype=gacc, device=q.device)
        dk = torch.zeros(k.shape, dtype=gacc, device=q.device)
        dv = torch.zeros(v.shape, dtype=gacc, device=q.device)
        bpairs = cls.bwd_pairs or cls.pairs
        for step in range(cp):
            src = cls._src(rank, step, cp)
            if cls.gather:
                kc, vc, dk, dv = kall[src], vall[src], dkall[src], dvall[src]
            if cls.save_all:
                kc, vc = ctx.kept[step]
            kh, vh, dkh, dvh = cls._view(kc), cls._view(vc), cls._view(dk), cls._view(dv)
            for qr, kr, causal in _pairs(bpairs, rank, src, cp, c):
                if cls.block_lse:
                    o_use, l_use = cls.attn(qh[..., qr, :], kh[..., kr, :], vh[..., kr, :], causal)
                else:
                    o_use, l_use = out[..., qr, :], lse[..., qr]
                gq, gk, gv = cls.attn_bwd(qh[..., qr, :], kh[..., kr, :], vh[..., kr, :], o_use, doh[..., qr, :],
                                          l_use, causal)
                dq[..., qr, :] += gq
                dkh[..., kr, :] += gk
                dvh[..., kr, :] += gv
                del gq, gk, gv, o_use, l_use
            del kh, vh, dkh, dvh
            last = step == cp - 1
            if not last and cls.bwd_pass_kv and not cls.save_all and not cls.gather:
                kc = comm.ring_pass(kc)
                vc = comm.ring_pass(vc)
            if cls.dkv == "travel" and not cls.gather:
                dk = comm.ring_pass(dk)
                dv = comm.ring_pass(dv)
            elif cls.dkv == "tail" and not last:
                dk = comm.ring_pass(dk)
                dv = comm.ring_pass(dv)
        if cls.dkv == "tail":
            for _ in range(cp - 1):
                dk = comm.ring_pass(dk)
                dv = comm.ring_pass(dv)
        elif cls.dkv == "stationary":
            dk = comm.ring_pass(dk)
            dv = comm.ring_pass(dv)
        if cls.gather:
            dk = torch.empty(k.shape, dtype=gacc, device=q.device)
            dv = torch.empty(v.shape, dtype=gacc, device=q.device)
            comm.reduce_scatter(dk, dkall)
            comm.reduce_scatter(dv, dvall)
        return cls._unview(dq).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


_RING_RIGHT = _RingBase.make("_RingRight")


def ring_attention_plain(q, k, v, comm):
    """RIGHT: the ring as the text describes it: zigzag chunk pairs, online-softmax merge in fp32, K/V passed cp-1
    times each way, dK/dV accumulators (fp32) travelling with K/V and passed cp times, so they arrive home."""
    _check_qkv(q, k, v)
    return _RING_RIGHT.apply(q, k, v, comm)


def _make_wrong(name, check_shape=True, check_odd=True, **opts):
    fn_cls = _RingBase.make("_Ring_" + name, **opts)

    def entry(q, k, v, comm):
        _check_qkv(q, k, v, check_shape, check_odd)
        return fn_cls.apply(q, k, v, comm)
    return entry


_ring_no_causal = _make_wrong("no_causal", pairs="no_causal")
_ring_all_chunks = _make_wrong("all_chunks", pairs="all_chunks")
_ring_contiguous = _make_wrong("contiguous", pairs="contiguous")
_ring_causal_by_index = _make_wrong("causal_by_index", pairs="causal_by_index")
_ring_theirs_wrong = _make_wrong("theirs_wrong", pairs="theirs_wrong")
_ring_src_plus = _make_wrong("src_plus", src_sign=+1)
_ring_no_rescale = _make_wrong("no_rescale", merge="no_rescale")
_ring_max_merge = _make_wrong("max_merge", merge="max")
_ring_fwd_native = _make_wrong("fwd_native", fwd_native=True)
_ring_dq_native = _make_wrong("dq_native", dq_native=True)
_ring_dkv_native = _make_wrong("dkv_native", dkv_native=True)
_ring_out_fp32 = _make_wrong("out_fp32", out_fp32=True)
_ring_block_lse = _make_wrong("block_lse", block_lse=True)
_ring_extra_pass = _make_wrong("extra_pass", fwd_extra_pass=True)
_ring_short = _make_wrong("short", fwd_short=True)
_ring_tail = _make_wrong("tail", dkv="tail")
_ring_stationary = _make_wrong("stationary", dkv="stationary")
_ring_bwd_no_pass = _make_wrong("bwd_no_pass", bwd_pass_kv=False)
_ring_bwd_no_causal = _make_wrong("bwd_no_causal", bwd_pairs="no_causal")
_ring_save_all = _make_wrong("save_all", save_all=True)
_ring_gather = _make_wrong("gather", gather=True)
_ring_layout = _make_wrong("layout", layout_bug=True)
_ring_full_scores = _make_wrong("full_scores", attn=staticmethod(_naive_attention_with_lse),
                                attn_bwd=staticmethod(_naive_attention_with_lse_backward))
_ring_no_odd_check = _make_wrong("no_odd_check", check_odd=False)


def ring_attention_no_causal(q, k, v, comm):
    """WRONG: the diagonal pair (a chunk against itself) is computed without the causal mask."""
    return _ring_no_causal(q, k, v, comm)


def ring_attention_all_chunks(q, k, v, comm):
    """WRONG: every held key chunk is attended (causal only within the own chunk): later chunks leak in."""
    return _ring_all_chunks(q, k, v, comm)


def ring_attention_contiguous(q, k, v, comm):
    """WRONG: treats the rank's tokens as one contiguous block (rank r = tokens r·n…), not cp_positions' zigzag."""
    return _ring_contiguous(q, k, v, comm)


def ring_attention_causal_by_index(q, k, v, comm):
    """WRONG: the causal flag is (i == j), the chunks' places in the pair, not kc == qc: an earlier chunk of another
    rank gets masked as if it were the query's own (wrong for cp >= 2 only)."""
    return _ring_causal_by_index(q, k, v, comm)


def ring_attention_theirs_wrong(q, k, v, comm):
    """WRONG: the source rank's second chunk is taken as 2cp-1-rank instead of 2cp-1-src (wrong for cp >= 2)."""
    return _ring_theirs_wrong(q, k, v, comm)


def ring_attention_src_plus(q, k, v, comm):
    """WRONG: labels the K/V held at step t as rank + t's (ring_pass brings rank - 1's): the same for cp = 2, wrong
    chunk pairs for cp >= 3."""
    return _ring_src_plus(q, k, v, comm)


def ring_attention_no_rescale(q, k, v, comm):
    """WRONG: the merge forgets to rescale the running output by exp(lse_old - lse)."""
    return _ring_no_rescale(q, k, v, comm)


def ring_attention_max_merge(q, k, v, comm):
    """WRONG: lse = max(lse, l_j) instead of logaddexp: the blocks' weights do not sum to one."""
    return _ring_max_merge(q, k, v, comm)


def ring_attention_fwd_native(q, k, v, comm):
    """WRONG: forward's running output and lse in q's dtype, not fp32 (only wrong in bf16/fp16)."""
    return _ring_fwd_native(q, k, v, comm)


def ring_attention_dq_native(q, k, v, comm):
    """WRONG: backward's dq accumulator in q's dtype, not fp32 (only in bf16/fp16, only in backward)."""
    return _ring_dq_native(q, k, v, comm)


def ring_attention_dkv_native(q, k, v, comm):
    """WRONG: the travelling dK/dV accumulators in K's dtype (half the bytes), not fp32: only in bf16/fp16 backward."""
    return _ring_dkv_native(q, k, v, comm)


def ring_attention_out_fp32(q, k, v, comm):
    """WRONG: returns the fp32 accumulator, not q's dtype (only visible for bf16/fp16 inputs)."""
    return _ring_out_fp32(q, k, v, comm)


def ring_attention_block_lse(q, k, v, comm):
    """WRONG: backward uses each block's own output and lse instead of the final ones (text: the *final* output and
    log-sum-exp)."""
    return _ring_block_lse(q, k, v, comm)


def ring_attention_extra_pass(q, k, v, comm):
    """WRONG: forward passes K and V cp times (one useless pass after the last block): results right, bytes not
    (the text: cp - 1 passes in forward)."""
    return _ring_extra_pass(q, k, v, comm)


def ring_attention_short(q, k, v, comm):
    """WRONG: forward runs cp - 1 ring steps: the last source's K/V is never attended."""
    return _ring_short(q, k, v, comm)


def ring_attention_tail(q, k, v, comm):
    """WRONG: dK/dV travel with K/V, then go cp - 1 more steps 'back home' instead of one: right for cp <= 2, the
    gradients land on the wrong rank for cp >= 3."""
    return _ring_tail(q, k, v, comm)


def ring_attention_stationary(q, k, v, comm):
    """WRONG: dK/dV accumulate in one buffer that stays on the rank (every source's keys summed together), then one
    pass: the gradients do not travel with K and V."""
    return _ring_stationary(q, k, v, comm)


def ring_attention_bwd_no_pass(q, k, v, comm):
    """WRONG: backward never passes K/V: each step uses the rank's own K/V with another source's chunk pairs."""
    return _ring_bwd_no_pass(q, k, v, comm)


def ring_attention_bwd_no_causal(q, k, v, comm):
    """WRONG: only in backward: the diagonal pair's gradients are computed without the causal mask."""
    return _ring_bwd_no_causal(q, k, v, comm)


def ring_attention_save_all(q, k, v, comm):
    """WRONG: forward keeps every source's K/V for backward (no ring in backward's K/V): memory grows as N, not N/cp."""
    return _ring_save_all(q, k, v, comm)


def ring_attention_gather(q, k, v, comm):
    """WRONG: all-gathers the whole sequence's K/V (and reduce-scatters dK/dV): the text says only ring_pass, never
    gathering the whole sequence."""
    return _ring_gather(q, k, v, comm)


def ring_attention_layout(q, k, v, comm):
    """WRONG: (seq, batch, heads, d).transpose(1, 2) as the heads-first view: attends over the batch dimension."""
    return _ring_layout(q, k, v, comm)


def ring_attention_full_scores(q, k, v, comm):
    """WRONG: its own attention for each pair, the whole (c x c) score matrix at once instead of attention_with_lse's
    query tiles: the peak exceeds 4 query tiles' scores once a chunk is longer than 256 tokens."""
    return _ring_full_scores(q, k, v, comm)


def ring_attention_no_odd_check(q, k, v, comm):
    """WRONG: an odd seq_local is not refused (the chunks are cut short silently)."""
    return _ring_no_odd_check(q, k, v, comm)


def ring_attention_no_shape_check(q, k, v, comm):
    """WRONG: q, k, v of different shapes (or not 4-D k, v) are not refused with ValueError."""
    if q.dim() != 4 or q.shape[0] % 2:
        raise ValueError("q must be 4-D with an even seq_local")
    return _RING_RIGHT.apply(q, k, v, comm)


class _RingPacked(torch.autograd.Function):
    """K and V stacked into one tensor and passed with one ring_pass per step; every pair computed on fp32 (fp64)
    copies of its slices, so attention_with_lse's results come back already wide; dK and dV travel as one fp32
    tensor."""

    @staticmethod
    def forward(ctx, q, k, v, comm):
        cp, rank = comm.world_size, comm.rank
        c = q.shape[0] // 2
        wide = _acc_dtype(q.dtype)
        qh = _heads_first(q)
        out = torch.zeros(qh.shape, dtype=wide, device=q.device)
        lse = torch.full(qh.shape[:-1], float("-inf"), dtype=wide, device=q.device)
        kv = torch.stack((k, v))  # (2, seq, b, h, d): contiguous, one pass
        for step in range(cp):
            src = (rank - step) % cp
            for qr, kr, causal in _chunk_pairs(rank, src, cp, c):
                kb = kv[0, kr].permute(1, 2, 0, 3).to(wide)
                vb = kv[1, kr].permute(1, 2, 0, 3).to(wide)
                o, l = attention_with_lse(qh[..., qr, :].to(wide), kb, vb, causal)
                new = torch.logaddexp(lse[..., qr], l)
                out[..., qr, :] = (out[..., qr, :] * (lse[..., qr] - new).exp().unsqueeze(-1)
                                   + o * (l - new).exp().unsqueeze(-1))
                lse[..., qr] = new
                del kb, vb, o, l, new
            if step + 1 < cp:
                kv = comm.ring_pass(kv)
        del kv
        ctx.comm = comm
        ctx.save_for_backward(q, k, v, out, lse)
        return out.permute(2, 0, 1, 3).to(q.dtype).contiguous()

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm = ctx.comm
        cp, rank = comm.world_size, comm.rank
        c = q.shape[0] // 2
        wide = _acc_dtype(q.dtype)
        qh, doh = _heads_first(q), _heads_first(dout)
        dq = torch.zeros(qh.shape, dtype=wide, device=q.device)
        kv = torch.stack((k, v))
        dkv = torch.zeros(kv.shape, dtype=wide, device=q.device)  # travels with kv
        for step in range(cp):
            src = (rank - step) % cp
            for qr, kr, causal in _chunk_pairs(rank, src, cp, c):
                kb = kv[0, kr].permute(1, 2, 0, 3).to(wide)
                vb = kv[1, kr].permute(1, 2, 0, 3).to(wide)
                gq, gk, gv = attention_with_lse_backward(qh[..., qr, :].to(wide), kb, vb, out[..., qr, :],
                                                         doh[..., qr, :], lse[..., qr], causal)
                dq[..., qr, :] += gq
                dkv[0, kr] += gk.permute(2, 0, 1, 3)
                dkv[1, kr] += gv.permute(2, 0, 1, 3)
                del kb, vb, gq, gk, gv
            if step + 1 < cp:
                kv = comm.ring_pass(kv)
            dkv = comm.ring_pass(dkv)
        del kv
        return dq.permute(2, 0, 1, 3).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


def ring_attention_packed(q, k, v, comm):
    """RIGHT: K and V stacked and passed as one tensor (the same bytes), pairs computed on widened slices; dK/dV
    travel together as one fp32 tensor, cp passes."""
    if q.dim() != 4 or tuple(k.shape) != tuple(q.shape) or tuple(v.shape) != tuple(q.shape):
        raise ValueError("q, k and v must be 4-D tensors of one shape")
    if q.shape[0] % 2 == 1:
        raise ValueError("seq_local must be even")
    return _RingPacked.apply(q, k, v, comm)


class _RingNumDen(torch.autograd.Function):
    """The classic online softmax: a running max, an un-normalized numerator and a denominator, normalized at the
    end; backward receives K/V and their gradients at the top of each step, and sends the gradients home last."""

    @staticmethod
    def forward(ctx, q, k, v, comm):
        cp, rank = comm.world_size, comm.rank
        n = q.shape[0]
        c = n // 2
        wide = _acc_dtype(q.dtype)
        qh = _heads_first(q)
        b, h, _, d = qh.shape
        num = torch.zeros(b, h, n, d, dtype=wide, device=q.device)
        den = torch.zeros(b, h, n, dtype=wide, device=q.device)
        mx = torch.full((b, h, n), float("-inf"), dtype=wide, device=q.device)
        kc, vc = k.contiguous(), v.contiguous()
        for step in range(cp):
            if step:
                kc, vc = comm.ring_pass(kc), comm.ring_pass(vc)
            src = (rank - step) % cp
            kh, vh = _heads_first(kc), _heads_first(vc)
            for qr, kr, causal in _chunk_pairs(rank, src, cp, c):
                o, l = attention_with_lse(qh[..., qr, :], kh[..., kr, :], vh[..., kr, :], causal)
                m_old = mx[..., qr].clone()
                m_new = torch.maximum(m_old, l)
                a, bb = torch.exp(m_old - m_new), torch.exp(l - m_new)
                num[..., qr, :] = num[..., qr, :] * a[..., None] + o.to(wide) * bb[..., None]
                den[..., qr] = den[..., qr] * a + bb
                mx[..., qr] = m_new
                del o, l, m_old, m_new, a, bb
            del kh, vh
        del kc, vc
        num /= den[..., None]
        lse = mx + torch.log(den)
        del den, mx
        ctx.comm = comm
        ctx.save_for_backward(q, k, v, num, lse)
        res = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        res.copy_(num.permute(2, 0, 1, 3))
        return res

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm = ctx.comm
        cp, rank = comm.world_size, comm.rank
        c = q.shape[0] // 2
        wide = _acc_dtype(q.dtype)
        qh, doh = _heads_first(q), _heads_first(dout)
        dq = torch.zeros(qh.shape, dtype=wide, device=q.device)
        kc, vc = k.contiguous(), v.contiguous()
        dk = torch.zeros(k.shape, dtype=wide, device=q.device)
        dv = torch.zeros(v.shape, dtype=wide, device=q.device)
        for step in range(cp):
            if step:
                kc, vc = comm.ring_pass(kc), comm.ring_pass(vc)
                dk, dv = comm.ring_pass(dk), comm.ring_pass(dv)
            src = (rank - step) % cp
            kh, vh = _heads_first(kc), _heads_first(vc)
            for qr, kr, causal in _chunk_pairs(rank, src, cp, c):
                gq, gk, gv = attention_with_lse_backward(qh[..., qr, :], kh[..., kr, :], vh[..., kr, :],
                                                         out[..., qr, :], doh[..., qr, :], lse[..., qr], causal)
                dq[..., qr, :] += gq
                dk[kr] += gk.permute(2, 0, 1, 3)
                dv[kr] += gv.permute(2, 0, 1, 3)
                del gq, gk, gv
            del kh, vh
        del kc, vc
        dk, dv = comm.ring_pass(dk), comm.ring_pass(dv)  # the last source's gradients go home
        return dq.permute(2, 0, 1, 3).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def ring_attention_numden(q, k, v, comm):
    """RIGHT: online softmax kept as running max / numerator / denominator (the same merge, normalized at the end);
    backward passes at the top of each step and sends the gradients home after the loop (still cp - 1 K/V passes
    and cp gradient passes)."""
    for t in (q, k, v):
        if t.ndim != 4:
            raise ValueError("q, k, v must be 4-D")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError("q, k, v must have one shape")
    if q.shape[0] & 1:
        raise ValueError("seq_local must be even")
    return _RingNumDen.apply(q, k, v, comm)


# ===================================================================================== pipeline_schedule

def _order(schedule: str, p: int, m: int, s: int) -> list[tuple[str, int]]:
    """The text's orders."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    w = min(p - 1 - s, m)
    ops = [("F", j) for j in range(w)]
    i = 0
    while w + i < m:
        ops += [("F", w + i), ("B", i)]
        i += 1
    return ops + [("B", j) for j in range(i, m)]


def _check_pipeline_args(n_stages, n_micro, schedule, fwd_time, bwd_time):
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    if n_stages < 1 or n_micro < 1:
        raise ValueError("n_stages and n_micro must be at least 1")
    if not (fwd_time > 0 and bwd_time > 0):
        raise ValueError("fwd_time and bwd_time must be positive")


def _in_flight(stage_ops) -> int:
    held = most = 0
    for kind, *_ in stage_ops:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


def _sweep_simulate(orders, fwd_time, bwd_time, dep_mode="end", stage_free=True, bwd_duration=None):
    """Place each stage's next op whenever its dependency has ended; sweep the stages until all are placed."""
    p = len(orders)
    done: dict[tuple[str, int, int], tuple[float, float]] = {}
    pos, free = [0] * p, [0.0] * p
    ops = [[] for _ in range(p)]
    left = sum(len(o) for o in orders)
    while left:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, j = orders[s][pos[s]]
                if kind == "F":
                    dep = ("F", s - 1, j) if s > 0 else None
                else:
                    dep = ("B", s + 1, j) if s < p - 1 else ("F", s, j)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep][1 if dep_mode == "end" else 0]
                start = max(free[s], ready) if stage_free else ready
                dur = fwd_time if kind == "F" else (bwd_time if bwd_duration is None else bwd_duration)
                end = start + dur
                done[(kind, s, j)] = (start, end)
                ops[s].append((kind, j, start, end))
                free[s] = end
                pos[s] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks")
    return ops


def _result(ops, n_micro, fwd_time, bwd_time, in_flight=None):
    total = max(op[3] for stage in ops for op in stage)
    return {"ops": ops, "total_time": total,
            "bubble_fraction": (total - n_micro * (fwd_time + bwd_time)) / total,
            "in_flight": in_flight if in_flight is not None else [_in_flight(o) for o in ops]}


def pipeline_schedule_sweeps(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """RIGHT: the text's orders, placed by sweeps over the stages (an op as soon as its stage is free and its input
    has ended), in-flight counted along each stage's ops."""
    _check_pipeline_args(n_stages, n_micro, schedule, fwd_time, bwd_time)
    orders = [_order(schedule, n_stages, n_micro, s) for s in range(n_stages)]
    return _result(_sweep_simulate(orders, fwd_time, bwd_time), n_micro, fwd_time, bwd_time)


def pipeline_schedule_fixed_point(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """RIGHT: times as a longest path, found by relaxing start = max(previous op's end, input's end) until nothing
    changes; the 1F1B order built with counters; in-flight from a time sweep of the events."""
    if schedule != "gpipe" and schedule != "1f1b":
        raise ValueError("unknown schedule")
    if n_stages < 1 or n_micro < 1:
        raise ValueError("sizes")
    if fwd_time <= 0 or bwd_time <= 0:
        raise ValueError("times")
    p, m = n_stages, n_micro
    orders = []
    for s in range(p):
        if schedule == "gpipe":
            orders.append([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
            continue
        warm = min(p - 1 - s, m)
        nf = nb = 0
        order = []
        while nf < warm:
            order.append(("F", nf)); nf += 1
        while nf < m:
            order.append(("F", nf)); nf += 1
            order.append(("B", nb)); nb += 1
        while nb < m:
            order.append(("B", nb)); nb += 1
        orders.append(order)
    index = {(s, op): i for s in range(p) for i, op in enumerate(orders[s])}
    dur = {"F": float(fwd_time), "B": float(bwd_time)}
    start = {(s, i): 0.0 for s in range(p) for i in range(len(orders[s]))}
    changed = True
    while changed:
        changed = False
        for s in range(p):
            for i, (kind, j) in enumerate(orders[s]):
                t = 0.0
                if i:
                    t = start[(s, i - 1)] + dur[orders[s][i - 1][0]]
                if kind == "F" and s > 0:
                    t = max(t, start[(s - 1, index[(s - 1, ("F", j))])] + dur["F"])
                if kind == "B" and s < p - 1:
                    t = max(t, start[(s + 1, index[(s + 1, ("B", j))])] + dur["B"])
                if kind == "B" and s == p - 1:
                    t = max(t, start[(s, index[(s, ("F", j))])] + dur["F"])
                if t != start[(s, i)]:
                    start[(s, i)] = t
                    changed = True
    ops = [[(kind, j, start[(s, i)], start[(s, i)] + dur[kind]) for i, (kind, j) in enumerate(orders[s])]
           for s in range(p)]
    in_flight = []
    for s in range(p):
        events = sorted([(e, 0) for kind, _, _, e in ops[s] if kind == "B"] +
                        [(st, 1) for kind, _, st, _ in ops[s] if kind == "F"])
        held = most = 0
        for _, up in events:
            held += 1 if up else -1
            most = max(most, held)
        in_flight.append(most)
    total = max(op[3] for stage in ops for op in stage)
    return {"ops": ops, "total_time": total, "bubble_fraction": (total - m * (fwd_time + bwd_time)) / total,
            "in_flight": in_flight}


def pipeline_schedule_events(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """RIGHT: a discrete-event simulator: a heap of op completions; when one ends, every stage whose next op has its
    input is started (at max(now-free, input end)); the order list from a generator."""
    _check_pipeline_args(n_stages, n_micro, schedule, fwd_time, bwd_time)
    p, m = n_stages, n_micro

    def order(s):
        if schedule == "gpipe":
            yield from (("F", j) for j in range(m))
            yield from (("B", j) for j in range(m))
            return
        w = min(p - 1 - s, m)
        yield from (("F", j) for j in range(w))
        for i in range(m - w):
            yield ("F", w + i)
            yield ("B", i)
        yield from (("B", j) for j in range(m - w, m))

    orders = [list(order(s)) for s in range(p)]
    finished: dict = {}
    nxt, free, busy = [0] * p, [0.0] * p, [False] * p
    ops = [[] for _ in range(p)]
    heap: list = []

    def try_start(s, now):
        if busy[s] or nxt[s] >= len(orders[s]):
            return
        kind, j = orders[s][nxt[s]]
        if kind == "F":
            need = None if s == 0 else ("F", s - 1, j)
        else:
            need = ("F", s, j) if s == p - 1 else ("B", s + 1, j)
        if need is not None and need not in finished:
            return
        begin = max(free[s], finished[need] if need else 0.0)
        end = begin + (fwd_time if kind == "F" else bwd_time)
        ops[s].append((kind, j, begin, end))
        busy[s] = True
        nxt[s] += 1
        heapq.heappush(heap, (end, s, kind, j))

    for s in range(p):
        try_start(s, 0.0)
    while heap:
        end, s, kind, j = heapq.heappop(heap)
        finished[(kind, s, j)] = end
        busy[s], free[s] = False, end
        for r in range(p):
            try_start(r, end)
    total = max(ops[s][-1][3] for s in range(p))
    return {"ops": ops, "total_time": total, "bubble_fraction": (total - m * (fwd_time + bwd_time)) / total,
            "in_flight": [_in_flight(o) for o in ops]}


def _order_variant(variant, schedule, p, m, s):
    if schedule == "gpipe":
        if variant == "gpipe_reverse_backward":
            return [("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]
        return _order(schedule, p, m, s)
    if variant == "no_warmup":
        w = 0
    elif variant == "warmup_p_minus_s":
        w = min(p - s, m)
    elif variant == "warmup_by_stage":
        w = min(s, m)
    else:
        w = min(p - 1 - s, m)
    ops = [("F", j) for j in range(w)]
    i = 0
    while w + i < m:
        ops += [("B", i), ("F", w + i)] if variant == "b_then_f" else [("F", w + i), ("B", i)]
        i += 1
    rest = [("B", j) for j in range(i, m)]
    if variant == "cooldown_reversed":
        rest.reverse()
    return ops + rest


def _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, *, variant=None, dep_mode="end",
                    stage_free=True, bwd_duration=None, result=None, check=None):
    if check != "skip":
        if check == "times_nonneg":
            if schedule not in ("gpipe", "1f1b") or n_stages < 1 or n_micro < 1 or fwd_time < 0 or bwd_time < 0:
                raise ValueError("bad arguments")
        elif check == "lower":
            if str(schedule).lower() not in ("gpipe", "1f1b") or n_stages < 1 or n_micro < 1 or \
                    fwd_time <= 0 or bwd_time <= 0:
                raise ValueError("bad arguments")
            schedule = schedule.lower()
        elif check == "no_micro":
            if schedule not in ("gpipe", "1f1b") or n_stages < 1 or fwd_time <= 0 or bwd_time <= 0:
                raise ValueError("bad arguments")
        else:
            _check_pipeline_args(n_stages, n_micro, schedule, fwd_time, bwd_time)
    orders = [_order_variant(variant, schedule, n_stages, n_micro, s) for s in range(n_stages)]
    ops = _sweep_simulate(orders, fwd_time, bwd_time, dep_mode, stage_free,
                          None if bwd_duration is None else bwd_duration(fwd_time, bwd_time))
    out = _result(ops, n_micro, fwd_time, bwd_time)
    if result is not None:
        result(out, n_stages, n_micro, schedule, fwd_time, bwd_time)
    return out


def pipeline_schedule_no_warmup(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: 1F1B without the warm-up: every stage starts F0, B0, F1, B1, ... (one micro-batch in flight)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, variant="no_warmup")


def pipeline_schedule_warmup_p_minus_s(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: warm-up of min(p - s, m) forwards, one too many (the text: min(p - 1 - s, m))."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, variant="warmup_p_minus_s")


def pipeline_schedule_warmup_by_stage(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: warm-up min(s, m): the last stage warms up longest, the first not at all (stages reversed)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, variant="warmup_by_stage")


def pipeline_schedule_b_then_f(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: the steady phase runs backward i before forward w + i (the text: forward w + i, then backward i)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, variant="b_then_f")


def pipeline_schedule_cooldown_reversed(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: 1F1B's remaining backwards run newest first (the text: in order)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, variant="cooldown_reversed")


def pipeline_schedule_gpipe_reverse_backward(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: GPipe's backwards newest first (autograd's habit); the text: every backward, micro-batches in order."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, variant="gpipe_reverse_backward")


def pipeline_schedule_dep_start(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: an op waits for its input's op to *start*, not to finish."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, dep_mode="start")


def pipeline_schedule_overlap(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: an op starts when its input is ready even if its stage is still busy (ops of a stage overlap)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, stage_free=False)


def pipeline_schedule_bwd_twice_fwd(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: a backward lasts 2 x fwd_time (the usual rule of thumb) whatever bwd_time says: right only for the
    default times."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, bwd_duration=lambda f, b: 2 * f)


def _res_total_last_stage(out, p, m, schedule, f, b):
    out["total_time"] = out["ops"][-1][-1][3]
    out["bubble_fraction"] = (out["total_time"] - m * (f + b)) / out["total_time"]


def pipeline_schedule_total_last_stage(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: total_time is when the last stage's last op ends, not the last op of all (stage 0's last backward)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_total_last_stage)


def _res_bubble_over_compute(out, p, m, schedule, f, b):
    out["bubble_fraction"] = (out["total_time"] - m * (f + b)) / (m * (f + b))


def pipeline_schedule_bubble_over_compute(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: idle time divided by the compute time m(F + B), not by total_time."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_bubble_over_compute)


def _res_bubble_analytic_first_stage(out, p, m, schedule, f, b):
    out["bubble_fraction"] = (p - 1) / (m + p)


def pipeline_schedule_bubble_off_by_one(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: bubble_fraction as (p - 1)/(m + p): an off-by-one of the text's (p - 1)/(m + p - 1)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_bubble_analytic_first_stage)


def _res_in_flight_forwards(out, p, m, schedule, f, b):
    out["in_flight"] = [sum(1 for op in o if op[0] == "F") for o in out["ops"]]


def pipeline_schedule_in_flight_forwards(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: in_flight counts every forward run, never subtracting the backwards (m for both schedules)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_in_flight_forwards)


def _res_in_flight_p_minus_s(out, p, m, schedule, f, b):
    if schedule == "1f1b":
        out["in_flight"] = [p - s for s in range(p)]


def pipeline_schedule_in_flight_no_min(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: 1F1B's in_flight written as p - s from the text's bound, forgetting that m < p - s holds only m: wrong
    only when n_micro < n_stages."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_in_flight_p_minus_s)


def _res_in_flight_analytic_both(out, p, m, schedule, f, b):
    out["in_flight"] = [min(p - s, m) for s in range(p)]


def pipeline_schedule_in_flight_1f1b_for_gpipe(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: in_flight = min(p - s, m) for both schedules: GPipe holds all m micro-batches."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_in_flight_analytic_both)


def _res_in_flight_scalar(out, p, m, schedule, f, b):
    out["in_flight"] = max(out["in_flight"])


def pipeline_schedule_in_flight_scalar(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: in_flight as one number (the most over stages), not one per stage."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_in_flight_scalar)


def _res_ops_lists(out, p, m, schedule, f, b):
    out["ops"] = [[list(op) for op in o] for o in out["ops"]]


def pipeline_schedule_ops_lists(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: each op as a [kind, micro_batch, start, end] list, not a tuple."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_ops_lists)


def _res_ops_sorted_kind(out, p, m, schedule, f, b):
    out["ops"] = [sorted(o, key=lambda op: (op[0] == "B", op[1])) for o in out["ops"]]


def pipeline_schedule_ops_grouped(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: each stage's ops listed forwards first then backwards, not in the order the stage runs them."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, result=_res_ops_sorted_kind)


def pipeline_schedule_zero_time_ok(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: a time of 0 is accepted (only negative times refused): the text says times must be positive."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, check="times_nonneg")


def pipeline_schedule_case_insensitive(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: "GPipe" or "1F1B" accepted: the text raises for a schedule other than "gpipe" and "1f1b"."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, check="lower")


def pipeline_schedule_no_micro_check(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: n_micro = 0 is not refused (it ends in max() of an empty sequence or an empty schedule)."""
    return _pipeline_wrong(n_stages, n_micro, schedule, fwd_time, bwd_time, check="no_micro")


def pipeline_schedule_int_times(n_stages, n_micro, schedule="1f1b", fwd_time=1.0, bwd_time=2.0):
    """WRONG: times rounded to whole units (int(fwd_time), int(bwd_time)) inside the simulation: wrong for
    fractional times (and 0.5 becomes 0)."""
    _check_pipeline_args(n_stages, n_micro, schedule, fwd_time, bwd_time)
    f, b = max(int(fwd_time), 1), max(int(bwd_time), 1)
    orders = [_order(schedule, n_stages, n_micro, s) for s in range(n_stages)]
    return _result(_sweep_simulate(orders, f, b), n_micro, f, b)


# ======================================================================================== memory_per_gpu

def _stage_params_own(cfg, tp, pp, tie_aware=True, vocab_every_stage=False):
    """Ψ re-derived from the text (stage_params' rule): ceil(L/pp) blocks / tp (norms whole), the vocabulary padded
    to a multiple of tp, embedding and head both when pp = 1 (one when tied), one otherwise, and the final norm."""
    if tp < 1 or pp < 1 or pp > cfg.n_layers:
        raise ValueError("tp, pp")
    h = cfg.d_model
    block = (h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h + 3 * h * cfg.ffn_hidden) // tp + 2 * h
    vocab = _ceil_div(cfg.vocab_size, tp) * h
    if vocab_every_stage:
        n_vocab = 2
    elif pp == 1:
        n_vocab = 1 if (tie_aware and cfg.tie_embeddings) else 2
    else:
        n_vocab = 1
    return _ceil_div(cfg.n_layers, pp) * block + n_vocab * vocab + h


def _mem_wrong(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute, *, tab, group="dpcp",
               shard="ceil", thr=(3, 2, 1), opt_bytes=12, opt_ceil_of_bytes=False, flight="min", rebuild="none",
               rebuild_seq="cp", act_seq="cp", sp=True, layers="ceil", psi_fn=None, checks=()):
    if "zero_upper" not in checks and zero not in (0, 1, 2, 3):
        raise ValueError("zero")
    if "zero_upper" in checks and zero < 0:
        raise ValueError("zero")
    sizes = (seq_len, micro_batch, tp, pp, cp, dp) if "n_micro" in checks else \
        (seq_len, micro_batch, n_micro, tp, pp, cp, dp)
    if min(sizes) < 1:
        raise ValueError("size")
    if pp > cfg.n_layers:
        raise ValueError("pp")
    if "seq" not in checks and cp > 1 and seq_len % (2 * cp):
        raise ValueError("seq")
    if "seq" in checks and "seq_cp" in checks and seq_len % cp:
        raise ValueError("seq")
    psi = psi_fn(cfg, tp, pp) if psi_fn else stage_params(cfg, tp, pp)
    d = {"dpcp": dp * cp, "dp": dp, "dpcptp": dp * cp * tp}[group]
    if shard == "ceil":
        sh = _ceil_div(psi, d)
    elif shard == "floor":
        sh = psi // d
    else:
        sh = psi / d
    p_thr, g_thr, o_thr = thr
    out = {"params": 2 * (sh if zero >= p_thr else psi), "grads": 2 * (sh if zero >= g_thr else psi)}
    if opt_ceil_of_bytes:
        out["optimizer"] = _ceil_div(opt_bytes * psi, d) if zero >= o_thr else opt_bytes * psi
    else:
        out["optimizer"] = opt_bytes * (sh if zero >= o_thr else psi)
    n_layers = _ceil_div(cfg.n_layers, pp) if layers == "ceil" else cfg.n_layers // pp
    local = seq_len // cp if act_seq == "cp" else seq_len
    held = {"min": min(pp, n_micro), "pp": pp, "n_micro": n_micro, "one": 1}[flight]
    per_block = tab(cfg, local, micro_batch, tp, sp, recompute)
    acts = held * n_layers * per_block
    rb_local = seq_len // cp if rebuild_seq == "cp" else seq_len
    if rebuild == "none" and recompute == "full":
        acts += tab(cfg, rb_local, micro_batch, tp, sp, "none")
    elif rebuild == "always":
        acts += tab(cfg, rb_local, micro_batch, tp, sp, "none")
    elif rebuild == "full_bytes" and recompute == "full":
        acts += tab(cfg, rb_local, micro_batch, tp, sp, "full")
    elif rebuild == "per_micro" and recompute == "full":
        acts += held * tab(cfg, rb_local, micro_batch, tp, sp, "none")
    out["activations"] = acts
    out["total"] = sum(out.values())
    return out


def _memory_wrong_entry(doc, **opts):
    def entry(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute):
        return _mem_wrong(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute,
                          tab=tp_activation_bytes, **opts)
    entry.__doc__ = doc
    return entry


memory_per_gpu_zero_over_dp = _memory_wrong_entry(
    "WRONG: ZeRO shards over the dp ranks only (the text: over dp·cp, context-parallel ranks hold the same weights).",
    group="dp")
memory_per_gpu_zero_over_all = _memory_wrong_entry(
    "WRONG: ZeRO shards over dp·cp·tp ranks: tensor-parallel ranks hold different weights.", group="dpcptp")
memory_per_gpu_shard_floor = _memory_wrong_entry(
    "WRONG: shard of floor(Ψ/d), not ⌈Ψ/d⌉ (wrong when d does not divide Ψ).", shard="floor")
memory_per_gpu_shard_float = _memory_wrong_entry(
    "WRONG: shard Ψ/d as a float: sharded categories (and the total) are floats, not ⌈Ψ/d⌉ ints.", shard="float")
memory_per_gpu_grads_from_stage1 = _memory_wrong_entry(
    "WRONG: gradients sharded from ZeRO-1 (the text: from stage 2).", thr=(3, 1, 1))
memory_per_gpu_params_from_stage2 = _memory_wrong_entry(
    "WRONG: parameters sharded from ZeRO-2 (the text: only at stage 3).", thr=(2, 2, 1))
memory_per_gpu_optimizer_from_stage2 = _memory_wrong_entry(
    "WRONG: optimizer states sharded only from ZeRO-2 (the text: from stage 1).", thr=(3, 2, 2))
memory_per_gpu_optimizer_8_bytes = _memory_wrong_entry(
    "WRONG: optimizer 8 bytes per parameter (m and v), forgetting the fp32 master weights (the text: 12).",
    opt_bytes=8)
memory_per_gpu_optimizer_ceil_bytes = _memory_wrong_entry(
    "WRONG: optimizer ⌈12Ψ/d⌉ instead of 12·⌈Ψ/d⌉ (wrong when d does not divide Ψ).", opt_ceil_of_bytes=True)
memory_per_gpu_in_flight_pp = _memory_wrong_entry(
    "WRONG: pp micro-batches in flight even when n_micro < pp (the text: min(pp, n_micro)).", flight="pp")
memory_per_gpu_in_flight_n_micro = _memory_wrong_entry(
    "WRONG: n_micro micro-batches in flight (GPipe's count), not 1F1B's min(pp, n_micro).", flight="n_micro")
memory_per_gpu_in_flight_one = _memory_wrong_entry(
    "WRONG: one micro-batch of activations (the last stage's count), not the first stage's min(pp, n_micro).",
    flight="one")
memory_per_gpu_no_rebuild = _memory_wrong_entry(
    "WRONG: under full recomputation, the block that backward rebuilds is not added.", rebuild="skip")
memory_per_gpu_rebuild_always = _memory_wrong_entry(
    "WRONG: the rebuilt block is added without recomputation too (the text: with full recomputation).",
    rebuild="always")
memory_per_gpu_rebuild_full_bytes = _memory_wrong_entry(
    "WRONG: the rebuilt block counted as tp_activation_bytes(..., 'full') (its input) instead of '... none'.",
    rebuild="full_bytes")
memory_per_gpu_rebuild_per_micro = _memory_wrong_entry(
    "WRONG: one rebuilt block per micro-batch in flight (the text: one block at a time).", rebuild="per_micro")
memory_per_gpu_rebuild_full_seq = _memory_wrong_entry(
    "WRONG: the rebuilt block counted at seq_len, not seq_len/cp (wrong only with cp > 1 and full recompute).",
    rebuild_seq="full")
memory_per_gpu_act_full_seq = _memory_wrong_entry(
    "WRONG: activations at seq_len tokens, not the rank's seq_len/cp.", act_seq="full", rebuild_seq="full")
memory_per_gpu_no_sp = _memory_wrong_entry(
    "WRONG: tp_activation_bytes with sequence_parallel=False (the text: TP always comes with SP here).", sp=False)
memory_per_gpu_layers_floor = _memory_wrong_entry(
    "WRONG: n_layers // pp blocks of activations, not ⌈n_layers/pp⌉ (the largest stage).", layers="floor")
memory_per_gpu_untied_vocab = _memory_wrong_entry(
    "WRONG: Ψ re-derived with embedding and head both at pp = 1 even when the config ties them (wrong only for tied "
    "embeddings).", psi_fn=lambda cfg, tp, pp: _stage_params_own(cfg, tp, pp, tie_aware=False))
memory_per_gpu_vocab_every_stage = _memory_wrong_entry(
    "WRONG: Ψ re-derived with the embedding and the head on every stage (the text: one of them when pp > 1).",
    psi_fn=lambda cfg, tp, pp: _stage_params_own(cfg, tp, pp, vocab_every_stage=True))
memory_per_gpu_no_seq_check = _memory_wrong_entry(
    "WRONG: with cp > 1 a seq_len that is not a multiple of 2·cp is not refused.", checks=("seq",))
memory_per_gpu_seq_check_cp = _memory_wrong_entry(
    "WRONG: checks seq_len % cp instead of seq_len % (2·cp) (zigzag needs 2·cp chunks).", checks=("seq", "seq_cp"))
memory_per_gpu_zero4_ok = _memory_wrong_entry(
    "WRONG: ZeRO stage 4 (or any stage above 3) accepted as stage 3.", checks=("zero_upper",))
memory_per_gpu_no_n_micro_check = _memory_wrong_entry(
    "WRONG: n_micro = 0 is not refused (activations come out 0): the text refuses any size below 1.",
    checks=("n_micro",))


def memory_per_gpu_direct(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute):
    """RIGHT: the rules as written, one after the other."""
    if zero not in (0, 1, 2, 3):
        raise ValueError("zero must be 0, 1, 2 or 3")
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("n_micro", n_micro), ("tp", tp),
                        ("pp", pp), ("cp", cp), ("dp", dp)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1")
    if pp > cfg.n_layers:
        raise ValueError("pp above n_layers")
    if cp > 1 and seq_len % (2 * cp) != 0:
        raise ValueError("seq_len must be a multiple of 2 cp")
    psi = stage_params(cfg, tp, pp)
    d = dp * cp
    shard = _ceil_div(psi, d)
    params = 2 * shard if zero == 3 else 2 * psi
    grads = 2 * shard if zero >= 2 else 2 * psi
    optimizer = 12 * shard if zero >= 1 else 12 * psi
    blocks = _ceil_div(cfg.n_layers, pp)
    tokens = seq_len // cp
    activations = min(pp, n_micro) * blocks * tp_activation_bytes(cfg, tokens, micro_batch, tp, True, recompute)
    if recompute == "full":
        activations += tp_activation_bytes(cfg, tokens, micro_batch, tp, True, "none")
    return {"params": params, "grads": grads, "optimizer": optimizer, "activations": activations,
            "total": params + grads + optimizer + activations}


def memory_per_gpu_tables(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute):
    """RIGHT: bytes per parameter and the stage each category is sharded from, in a table; divmod for the ceiling;
    activations checked first (tp_activation_bytes raises its own errors)."""
    if any(x < 1 for x in (seq_len, micro_batch, n_micro, tp, pp, cp, dp)):
        raise ValueError("a size below 1")
    if zero not in range(4):
        raise ValueError("ZeRO stage 0-3")
    if cp > 1 and seq_len % (2 * cp):
        raise ValueError("seq_len % 2cp")
    if pp > cfg.n_layers:
        raise ValueError("pp > n_layers")
    rebuilt = tp_activation_bytes(cfg, seq_len // cp, micro_batch, tp, True, "none")
    kept = rebuilt if recompute == "none" else tp_activation_bytes(cfg, seq_len // cp, micro_batch, tp, True,
                                                                     recompute)
    psi = stage_params(cfg, tp, pp)
    q, r = divmod(psi, dp * cp)
    shard = q + (r > 0)
    out = {}
    for name, nbytes, from_stage in (("params", 2, 3), ("grads", 2, 2), ("optimizer", 12, 1)):
        out[name] = nbytes * (shard if zero >= from_stage else psi)
    per_stage = -(-cfg.n_layers // pp)
    out["activations"] = min(pp, n_micro) * per_stage * kept + (rebuilt if recompute == "full" else 0)
    out["total"] = out["params"] + out["grads"] + out["optimizer"] + out["activations"]
    return out


def memory_per_gpu_own_psi(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute):
    """RIGHT: Ψ re-derived from the text's description of stage_params (tied embeddings, padded vocabulary)
    instead of calling it; the rest as written."""
    if zero not in (0, 1, 2, 3) or min(seq_len, micro_batch, n_micro, tp, pp, cp, dp) < 1:
        raise ValueError("zero or a size")
    if pp > cfg.n_layers or (cp > 1 and seq_len % (2 * cp)):
        raise ValueError("pp or seq_len")
    psi = _stage_params_own(cfg, tp, pp)
    shard = _ceil_div(psi, dp * cp)
    states = {"params": 2 * (shard if zero == 3 else psi), "grads": 2 * (psi if zero < 2 else shard),
              "optimizer": 12 * (psi if zero == 0 else shard)}
    per = tp_activation_bytes(cfg, seq_len // cp, micro_batch, tp, True, recompute)
    acts = per * _ceil_div(cfg.n_layers, pp) * min(pp, n_micro)
    if recompute == "full":
        acts = acts + tp_activation_bytes(cfg, seq_len // cp, micro_batch, tp, True, "none")
    states["activations"] = acts
    states["total"] = sum(states.values())
    return states


# ====================================================================================== plan_parallelism

def _tp_ok(cfg, tp):
    return cfg.n_heads % tp == 0 and cfg.n_kv_heads % tp == 0 and cfg.ffn_hidden % tp == 0


def _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8, *, mem, tps=None, cps=None,
                 pps=None, tp_check="all", seq_rule="2cptp", mb_rule="divides", n_micro_rule=">=", dp_rule="exact",
                 zeros=(0, 1, 2, 3), recomputes=("none", "full"), fit=lambda total, cap: total <= cap,
                 objective="overhead", pass_node=True, pick="min", floats=False, empty=None, swap=False):
    """A configurable search over the text's space; each wrong planner changes one rule."""
    tps = tps or (lambda: _powers_of_two(gpus_per_node))
    cps = cps or (lambda tp: _powers_of_two(n_gpus // tp))
    pps = pps or (lambda: range(1, cfg.n_layers + 1))
    found = []
    for tp in tps():
        if tp_check == "all" and not _tp_ok(cfg, tp):
            continue
        if tp_check == "no_kv" and (cfg.n_heads % tp or cfg.ffn_hidden % tp):
            continue
        if seq_len % tp:
            continue
        for cp in cps(tp):
            if cp > 1 and seq_len % ((2 * cp * tp) if seq_rule == "2cptp" else (2 * cp)):
                continue
            for pp in pps():
                if dp_rule == "exact" and n_gpus % (tp * cp * pp):
                    continue
                dp = n_gpus // (tp * cp * pp)
                if dp < 1:
                    continue
                for mb in _powers_of_two(global_batch):
                    if mb_rule == "divides" and global_batch % (dp * mb):
                        continue
                    n_micro = global_batch // (dp * mb)
                    if n_micro < 1:
                        continue
                    if n_micro_rule == ">=" and n_micro < pp:
                        continue
                    if n_micro_rule == ">" and n_micro <= pp:
                        continue
                    for zero in zeros:
                        for rec in recomputes:
                            args = (cfg, seq_len, mb, n_micro, tp, pp, cp, dp, zero, rec)
                            margs = (cfg, seq_len, mb, n_micro, tp, pp, dp, cp, zero, rec) if swap else args
                            total = mem(*margs)["total"]
                            cost = layout_cost(*args, gpus_per_node) if pass_node else layout_cost(*args)
                            plan = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero": zero, "recompute": rec,
                                    "micro_batch": mb, "n_micro": n_micro}
                            if floats:
                                plan["dp"] = n_gpus / (tp * cp * pp)
                                plan["n_micro"] = global_batch / (dp * mb)
                            if objective == "overhead":
                                key = cost["overhead_s"]
                            elif objective == "comm":
                                key = cost["comm_s"]
                            elif objective == "memory":
                                key = total
                            else:
                                key = objective(cost, total)
                            found.append((fit(total, gpu_bytes), key, total, plan))
                            if pick == "first" and found[-1][0]:
                                return plan
    fits = [f for f in found if f[0]]
    if not fits:
        if empty == "least_memory" and found:
            return min(found, key=lambda f: f[2])[3]
        return empty if empty != "least_memory" else None
    if pick == "within_5pct_least_memory":
        best = min(f[1] for f in fits)
        return min((f for f in fits if f[1] <= 1.05 * best), key=lambda f: f[2])[3]
    if pick == "ignore_fit":
        return min(found, key=lambda f: f[1])[3]
    return min(fits, key=lambda f: f[1])[3]


def _pp_powers(cfg):
    return lambda: _powers_of_two(cfg.n_layers)


def plan_parallelism_tp_unbounded(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: tp any power of two up to n_gpus (the text: up to gpus_per_node), so TP may leave the node."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        tps=lambda: _powers_of_two(n_gpus))


def plan_parallelism_tp_below_node(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: tp a power of two strictly below gpus_per_node (off by one: TP 8 on 8-GPU nodes never tried)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        tps=lambda: _powers_of_two(gpus_per_node - 1))


def plan_parallelism_tp_any_divisor(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: tp any divisor of the heads up to gpus_per_node, not only powers of two (e.g. tp = 3 for 3 heads)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        tps=lambda: range(1, gpus_per_node + 1))


def plan_parallelism_tp_no_kv_check(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: tp must divide n_heads and ffn_hidden but n_kv_heads is not checked (memory_per_gpu then refuses)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        tp_check="no_kv")


def plan_parallelism_no_cp(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: context parallelism never tried (cp = 1 only)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        cps=lambda tp: [1])


def plan_parallelism_cp_in_node(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: cp limited to what fits in a node beside tp (tp·cp <= gpus_per_node): the text bounds cp only by the
    GPUs (Llama 3 ran CP 16 beside TP 8)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        cps=lambda tp: _powers_of_two(max(1, gpus_per_node // tp)))


def plan_parallelism_cp_any(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: cp any whole number dividing the GPUs, not only powers of two."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        cps=lambda tp: range(1, n_gpus // tp + 1))


def plan_parallelism_seq_2cp_only(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: with cp > 1, seq_len a multiple of 2·cp only (the text: of 2·cp·tp)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        seq_rule="2cp")


def plan_parallelism_pp_powers(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: pp only powers of two (the text: every pp from 1 to n_layers, e.g. pp = 3 on 24 GPUs)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        pps=_pp_powers(cfg))


def plan_parallelism_pp_off_by_one(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: pp in range(1, n_layers): pp = n_layers (one block per stage) is never tried."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        pps=lambda: range(1, cfg.n_layers))


def plan_parallelism_dp_floor(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: dp = n_gpus // (tp·cp·pp) without requiring a whole number: layouts that leave GPUs unused."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        dp_rule="floor")


def plan_parallelism_batch_floor(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: global_batch need not be a multiple of dp·micro_batch (n_micro floored): the step is not the batch."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        mb_rule="floor")


def plan_parallelism_n_micro_strict(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: n_micro > pp (the text: at least pp)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        n_micro_rule=">")


def plan_parallelism_n_micro_any(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: no n_micro >= pp constraint (fewer micro-batches than stages allowed)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        n_micro_rule="any")


def plan_parallelism_no_zero3(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: ZeRO 0-2 only (the text: 0-3): misses layouts that only fit with sharded parameters."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        zeros=(0, 1, 2))


def plan_parallelism_full_recompute_only(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: always recomputes (recompute 'full' only): pays a third more compute where 'none' fits."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        recomputes=("full",))


def plan_parallelism_fit_strict(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: fits when total < gpu_bytes (the text: <=)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        fit=lambda total, cap: total < cap)


def plan_parallelism_fit_with_margin(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: keeps 10% of the card free (the notebook's advice) instead of the text's fit test total <= gpu_bytes."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        fit=lambda total, cap: total <= 0.9 * cap)


def plan_parallelism_least_memory(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: the layout that fits with the least memory, not the least overhead_s."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        objective="memory")


def plan_parallelism_comm_only(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: minimizes comm_s only, ignoring the bubble and the recomputation."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        objective="comm")


def plan_parallelism_no_bubble(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: minimizes comm_s + recompute_s, leaving out the bubble (so deep pipelines look free)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        objective=lambda cost, total: cost["comm_s"] + cost["recompute_s"])


def plan_parallelism_default_node(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: layout_cost called without gpus_per_node (always 8 per node): wrong when the cluster's nodes differ."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        pass_node=False)


def plan_parallelism_first_fit(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: returns the first layout that fits in search order, not the cheapest."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        pick="first")


def plan_parallelism_ignore_fit(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: the cheapest layout whether it fits or not (None only when no layout exists at all)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        pick="ignore_fit")


def plan_parallelism_near_tie_memory(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: a 'tie-break' that treats costs within 5% as tied and picks the least memory: a costlier plan."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        pick="within_5pct_least_memory")


def plan_parallelism_empty_dict(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: returns {} when nothing fits (the text: None)."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        empty={})


def plan_parallelism_least_memory_fallback(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: when nothing fits, returns the layout closest to fitting instead of None."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        empty="least_memory")


def plan_parallelism_float_counts(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: dp and n_micro returned as floats (n_gpus / (...), global_batch / (...)), not ints."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        floats=True)


def plan_parallelism_swapped_args(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """WRONG: memory_per_gpu called with dp and cp swapped (its order is ..., cp, dp): activations at seq/dp."""
    return _plan_engine(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node, mem=memory_per_gpu,
                        swap=True)


# ------------------------------------------------------------------------------------------- right planners

def plan_parallelism_nested(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """RIGHT: nested loops over the text's space, strict < keeps the first of ties."""
    best_cost, best = None, None
    for tp in _powers_of_two(gpus_per_node):
        if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp or seq_len % tp or n_gpus % tp:
            continue
        for cp in _powers_of_two(n_gpus // tp):
            if cp > 1 and seq_len % (2 * cp * tp):
                continue
            for pp in range(1, cfg.n_layers + 1):
                if n_gpus % (tp * cp * pp):
                    continue
                dp = n_gpus // (tp * cp * pp)
                for mb in _powers_of_two(global_batch // dp):
                    if global_batch % (dp * mb):
                        continue
                    n_micro = global_batch // (dp * mb)
                    if n_micro < pp:
                        continue
                    for zero in range(4):
                        for rec in ("none", "full"):
                            args = (cfg, seq_len, mb, n_micro, tp, pp, cp, dp, zero, rec)
                            if memory_per_gpu(*args)["total"] > gpu_bytes:
                                continue
                            cost = layout_cost(*args, gpus_per_node=gpus_per_node)["overhead_s"]
                            if best_cost is None or cost < best_cost:
                                best_cost = cost
                                best = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero": zero, "recompute": rec,
                                        "micro_batch": mb, "n_micro": n_micro}
    return best


def plan_parallelism_product(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """RIGHT: itertools.product over (recompute, zero, pp descending, cp, tp, micro_batch), every constraint as a
    filter, candidates collected and min() over (cost, order)."""
    tps = [t for t in _powers_of_two(gpus_per_node)
           if not (cfg.n_heads % t or cfg.n_kv_heads % t or cfg.ffn_hidden % t)]
    cps = list(_powers_of_two(n_gpus))
    mbs = list(_powers_of_two(global_batch))
    cands = []
    for rec, zero, pp, cp, tp, mb in itertools.product(("full", "none"), (3, 2, 1, 0),
                                                         range(cfg.n_layers, 0, -1), cps, tps, mbs):
        if n_gpus % (tp * cp * pp) != 0:
            continue
        dp = n_gpus // (tp * cp * pp)
        if seq_len % tp != 0 or (cp > 1 and seq_len % (2 * cp * tp) != 0):
            continue
        if global_batch % (dp * mb) != 0:
            continue
        n_micro = global_batch // (dp * mb)
        if n_micro < pp:
            continue
        args = (cfg, seq_len, mb, n_micro, tp, pp, cp, dp, zero, rec)
        if memory_per_gpu(*args)["total"] <= gpu_bytes:
            cands.append((layout_cost(*args, gpus_per_node)["overhead_s"], len(cands),
                          dict(tp=tp, pp=pp, cp=cp, dp=dp, zero=zero, recompute=rec, micro_batch=mb,
                               n_micro=n_micro)))
    return min(cands)[2] if cands else None


def plan_parallelism_cost_first(cfg, seq_len, global_batch, n_gpus, gpu_bytes, gpus_per_node=8):
    """RIGHT: enumerates the divisor triples (tp, cp, pp) of n_gpus first; costs a layout before its memory, and
    asks memory_per_gpu only when the layout would beat the best so far (the same answer, fewer memory calls)."""
    layouts = []
    tp = 1
    while tp <= gpus_per_node:
        if n_gpus % tp == 0 and not (cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp) \
                and seq_len % tp == 0:
            cp = 1
            while tp * cp <= n_gpus:
                if n_gpus % (tp * cp) == 0 and (cp == 1 or seq_len % (2 * cp * tp) == 0):
                    rest = n_gpus // (tp * cp)
                    for pp in range(1, min(cfg.n_layers, rest) + 1):
                        if rest % pp == 0:
                            layouts.append((tp, cp, pp, rest // pp))
                cp *= 2
        tp *= 2
    best = None
    for tp, cp, pp, dp in layouts:
        if global_batch % dp:
            continue
        per_rank = global_batch // dp
        mb = 1
        while mb <= per_rank:
            if per_rank % mb == 0 and per_rank // mb >= pp:
                n_micro = per_rank // mb
                for zero in (0, 1, 2, 3):
                    for rec in ("none", "full"):
                        args = (cfg, seq_len, mb, n_micro, tp, pp, cp, dp, zero, rec)
                        cost = layout_cost(*args, gpus_per_node)["overhead_s"]
                        if best is not None and cost >= best[0]:
                            continue
                        if memory_per_gpu(*args)["total"] <= gpu_bytes:
                            best = (cost, {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero": zero, "recompute": rec,
                                           "micro_batch": mb, "n_micro": n_micro})
            mb *= 2
    return None if best is None else best[1]


# ============================================================================================ the tables

BLIND = {
    "ring_attention": {
        "wrong": ["ring_attention_no_causal", "ring_attention_all_chunks", "ring_attention_contiguous",
                  "ring_attention_causal_by_index", "ring_attention_theirs_wrong", "ring_attention_src_plus",
                  "ring_attention_no_rescale", "ring_attention_max_merge", "ring_attention_fwd_native",
                  "ring_attention_dkv_native", "ring_attention_out_fp32",
                  "ring_attention_block_lse", "ring_attention_extra_pass", "ring_attention_short",
                  "ring_attention_tail", "ring_attention_stationary", "ring_attention_bwd_no_pass",
                  "ring_attention_bwd_no_causal", "ring_attention_save_all", "ring_attention_gather",
                  "ring_attention_layout", "ring_attention_full_scores", "ring_attention_no_odd_check",
                  "ring_attention_no_shape_check"],
        "right": ["ring_attention_plain", "ring_attention_packed", "ring_attention_numden"],
    },
    "pipeline_schedule": {
        "wrong": ["pipeline_schedule_no_warmup", "pipeline_schedule_warmup_p_minus_s",
                  "pipeline_schedule_warmup_by_stage", "pipeline_schedule_b_then_f",
                  "pipeline_schedule_cooldown_reversed", "pipeline_schedule_gpipe_reverse_backward",
                  "pipeline_schedule_dep_start", "pipeline_schedule_overlap", "pipeline_schedule_bwd_twice_fwd",
                  "pipeline_schedule_total_last_stage", "pipeline_schedule_bubble_over_compute",
                  "pipeline_schedule_bubble_off_by_one", "pipeline_schedule_in_flight_forwards",
                  "pipeline_schedule_in_flight_no_min", "pipeline_schedule_in_flight_1f1b_for_gpipe",
                  "pipeline_schedule_in_flight_scalar", "pipeline_schedule_ops_lists",
                  "pipeline_schedule_ops_grouped", "pipeline_schedule_zero_time_ok",
                  "pipeline_schedule_case_insensitive", 
                  "pipeline_schedule_int_times"],
        "right": ["pipeline_schedule_sweeps", "pipeline_schedule_fixed_point", "pipeline_schedule_events"],
    },
    "memory_per_gpu": {
        "wrong": ["memory_per_gpu_zero_over_dp", "memory_per_gpu_zero_over_all", "memory_per_gpu_shard_floor",
                  "memory_per_gpu_shard_float", "memory_per_gpu_grads_from_stage1",
                  "memory_per_gpu_params_from_stage2", "memory_per_gpu_optimizer_from_stage2",
                  "memory_per_gpu_optimizer_8_bytes", "memory_per_gpu_optimizer_ceil_bytes",
                  "memory_per_gpu_in_flight_pp", "memory_per_gpu_in_flight_n_micro", "memory_per_gpu_in_flight_one",
                  "memory_per_gpu_no_rebuild", "memory_per_gpu_rebuild_always", "memory_per_gpu_rebuild_full_bytes",
                  "memory_per_gpu_rebuild_per_micro", "memory_per_gpu_rebuild_full_seq",
                  "memory_per_gpu_act_full_seq", "memory_per_gpu_no_sp", "memory_per_gpu_layers_floor",
                  "memory_per_gpu_untied_vocab", "memory_per_gpu_vocab_every_stage", "memory_per_gpu_no_seq_check",
                  "memory_per_gpu_seq_check_cp", "memory_per_gpu_zero4_ok", "memory_per_gpu_no_n_micro_check"],
        "right": ["memory_per_gpu_direct", "memory_per_gpu_tables", "memory_per_gpu_own_psi"],
    },
    "plan_parallelism": {
        "wrong": ["plan_parallelism_tp_unbounded", "plan_parallelism_tp_below_node", "plan_parallelism_tp_any_divisor",
                  "plan_parallelism_tp_no_kv_check", "plan_parallelism_no_cp", "plan_parallelism_cp_in_node",
                  "plan_parallelism_cp_any", "plan_parallelism_seq_2cp_only", "plan_parallelism_pp_powers",
                  "plan_parallelism_pp_off_by_one", "plan_parallelism_dp_floor", "plan_parallelism_batch_floor",
                  "plan_parallelism_n_micro_strict", "plan_parallelism_n_micro_any", "plan_parallelism_no_zero3",
                  "plan_parallelism_full_recompute_only", "plan_parallelism_fit_strict",
                  "plan_parallelism_fit_with_margin", "plan_parallelism_least_memory", "plan_parallelism_comm_only",
                  "plan_parallelism_no_bubble", "plan_parallelism_default_node", "plan_parallelism_first_fit",
                  "plan_parallelism_ignore_fit", "plan_parallelism_near_tie_memory", "plan_parallelism_empty_dict",
                  "plan_parallelism_least_memory_fallback", "plan_parallelism_float_counts",
                  "plan_parallelism_swapped_args"],
        "right": ["plan_parallelism_nested", "plan_parallelism_product", "plan_parallelism_cost_first"],
    },
}


def _why(name: str) -> str:
    doc = " ".join((globals()[name].__doc__ or "").split())
    for tag in ("RIGHT:", "WRONG:"):
        if doc.startswith(tag):
            return doc[len(tag):].strip()
    raise AssertionError(f"{name}: docstring must start with RIGHT: or WRONG:")


WHY = {name: _why(name) for table in BLIND.values() for names in table.values() for name in names}
