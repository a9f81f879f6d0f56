"""Blind set for lesson 09_parallelism, exercises 1-4: written from the exercise text alone
(lessons/09_parallelism.ipynb), memfit.parallel, memfit.zero's Comm and memfit.gpt."""
import memfit  # noqa: F401  (first, as every course module)

import torch
import torch.nn.functional as F

from memfit.gpt import apply_rope, rms_norm, swiglu


# ============================================================================ conjugate_ops (exercise 1)
# ---------------------------------------------------------------------------- RIGHT: the plain one

class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        g = dy.contiguous()
        if g is dy:
            g = dy.clone()
        ctx.comm.all_reduce(g)
        return g, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        out = x.clone(memory_format=torch.contiguous_format)
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        comm = ctx.comm
        dy = dy.contiguous()
        out = dy.new_empty((dy.shape[0] // comm.world_size, *dy.shape[1:]))
        comm.reduce_scatter(out, dy)
        return out, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if x.dim() < 1 or x.shape[0] % comm.world_size:
            raise ValueError(f"sp_scatter: dim 0 ({x.shape[0] if x.dim() else None}) is not a multiple of "
                             f"world_size={comm.world_size}")
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // comm.world_size, *x.shape[1:]))
        comm.reduce_scatter(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        comm = ctx.comm
        dy = dy.contiguous()
        out = dy.new_empty((comm.world_size * dy.shape[0], *dy.shape[1:]))
        comm.all_gather(out, dy)
        return out, None


def tp_copy_plain(x, comm):
    """RIGHT: view forward, all-reduce of a contiguous copy of the gradient in backward."""
    return _Copy.apply(x, comm)


def tp_reduce_plain(x, comm):
    """RIGHT: clone to a contiguous new tensor and all-reduce it; identity backward."""
    return _Reduce.apply(x, comm)


def sp_gather_plain(x, comm):
    """RIGHT: all_gather into a new (world_size*n, ...) buffer; reduce_scatter of the gradient."""
    return _Gather.apply(x, comm)


def sp_scatter_plain(x, comm):
    """RIGHT: ValueError for an uneven dim 0, reduce_scatter forward, all_gather backward."""
    return _Scatter.apply(x, comm)


# The names the lesson's tp_block looks up (the check may swap in the course's reference operators).
tp_copy, tp_reduce, sp_gather, sp_scatter = tp_copy_plain, tp_reduce_plain, sp_gather_plain, sp_scatter_plain


# ---------------------------------------------------------------------------- RIGHT: flat buffers

class _CopyFlat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.clone()  # a copy is as good as a view: the values unchanged

    @staticmethod
    def backward(ctx, dy):
        flat = torch.empty(dy.numel(), dtype=dy.dtype, device=dy.device)
        flat.copy_(dy.reshape(-1))
        ctx.comm.all_reduce(flat)
        return flat.view(dy.shape), None


class _ReduceFlat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        flat = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
        flat.copy_(x.reshape(-1))
        comm.all_reduce(flat)
        return flat.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        return dy.view_as(dy), None


class _GatherFlat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        n = comm.world_size
        shard = x.reshape(-1).contiguous()
        flat = torch.empty(n * shard.numel(), dtype=x.dtype, device=x.device)
        comm.all_gather(flat, shard)
        return flat.view(n * x.shape[0], *x.shape[1:])

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        full = dy.reshape(-1).contiguous()
        part = torch.empty(full.numel() // n, dtype=dy.dtype, device=dy.device)
        ctx.comm.reduce_scatter(part, full)
        return part.view(dy.shape[0] // n, *dy.shape[1:]), None


class _ScatterFlat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        n = comm.world_size
        rows, rest = divmod(x.shape[0], n)
        if rest:
            raise ValueError("x.shape[0] must be a multiple of comm.world_size")
        ctx.comm = comm
        full = x.reshape(-1).contiguous()
        part = torch.empty(full.numel() // n, dtype=x.dtype, device=x.device)
        comm.reduce_scatter(part, full)
        return part.view(rows, *x.shape[1:])

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        shard = dy.reshape(-1).contiguous()
        flat = torch.empty(n * shard.numel(), dtype=dy.dtype, device=dy.device)
        ctx.comm.all_gather(flat, shard)
        return flat.view(n * dy.shape[0], *dy.shape[1:]), None


def tp_copy_flat(x, comm):
    """RIGHT: a copy forward (values unchanged), all-reduce of a fresh flat buffer in backward."""
    return _CopyFlat.apply(x, comm)


def tp_reduce_flat(x, comm):
    """RIGHT: all-reduce of a fresh flat copy, viewed back to x's shape."""
    return _ReduceFlat.apply(x, comm)


def sp_gather_flat(x, comm):
    """RIGHT: everything on flat 1-D buffers, viewed to shape afterwards."""
    return _GatherFlat.apply(x, comm)


def sp_scatter_flat(x, comm):
    """RIGHT: divmod check, flat reduce-scatter, flat all-gather backward."""
    return _ScatterFlat.apply(x, comm)


# ---------------------------------------------------------------------------- RIGHT: saved-shape variant

class _GatherSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm, ctx.shape = comm, tuple(x.shape)  # a tuple of ints is not a tensor
        out = torch.empty((comm.world_size * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        comm.all_gather(out, x if x.is_contiguous() else x.contiguous())
        return out

    @staticmethod
    def backward(ctx, dy):
        out = torch.empty(ctx.shape, dtype=dy.dtype, device=dy.device)
        ctx.comm.reduce_scatter(out, dy.contiguous())
        return out, None


class _ReduceEmptyLike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        out = torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def sp_gather_saved_shape(x, comm):
    """RIGHT: remembers the input's shape (ints on ctx) and reduce-scatters straight into it."""
    return _GatherSaved.apply(x, comm)


def tp_reduce_empty_like(x, comm):
    """RIGHT: empty_like (contiguous) + copy_, then all-reduce."""
    return _ReduceEmptyLike.apply(x, comm)


# ---------------------------------------------------------------------------- WRONG

class _CopyNoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def tp_copy_no_backward_reduce(x, comm):
    """WRONG: backward passes the gradient through: no all-reduce (f's gradient must be summed over ranks)."""
    return _CopyNoReduce.apply(x, comm)


class _CopyInplaceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        ctx.comm.all_reduce(dy)  # writes into the gradient it was handed (when contiguous)
        return dy, None


def tp_copy_inplace_grad(x, comm):
    """WRONG: all-reduces the incoming gradient in place: writes into the gradient it is handed."""
    return _CopyInplaceGrad.apply(x, comm)


class _CopyMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        g = dy.contiguous().clone()
        ctx.comm.all_reduce(g)
        return g / ctx.comm.world_size, None


def tp_copy_mean_grad(x, comm):
    """WRONG: divides the all-reduced gradient by world_size (a mean, as in data parallelism): text says the sum."""
    return _CopyMean.apply(x, comm)


class _CopyCloneNoncontig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        g = dy.clone()  # keeps dy's strides: a transposed gradient stays non-contiguous
        ctx.comm.all_reduce(g)
        return g, None


def tp_copy_noncontiguous_grad(x, comm):
    """WRONG: clones the gradient without making it contiguous: Comm refuses a non-contiguous gradient."""
    return _CopyCloneNoncontig.apply(x, comm)


class _ReduceInplaceInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        buf = x.contiguous()  # x itself when x is contiguous
        comm.all_reduce(buf)
        return buf.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def tp_reduce_writes_input(x, comm):
    """WRONG: all-reduces x itself (contiguous x), then returns a copy: writes into its input."""
    return _ReduceInplaceInput.apply(x, comm)


class _ReduceTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        out = x.contiguous().clone()
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        g = dy.contiguous().clone()
        ctx.comm.all_reduce(g)
        return g, None


def tp_reduce_backward_all_reduce(x, comm):
    """WRONG: all-reduces in backward too: g's backward is the identity (gradient t times too large)."""
    return _ReduceTwice.apply(x, comm)


class _ReduceMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        out = x.contiguous().clone()
        comm.all_reduce(out)
        return out / comm.world_size

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def tp_reduce_mean(x, comm):
    """WRONG: the mean over ranks, not the sum."""
    return _ReduceMean.apply(x, comm)


class _ReduceCloneNoncontig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        out = x.clone()  # preserve_format: a transposed x stays transposed
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def tp_reduce_noncontiguous(x, comm):
    """WRONG: x.clone() keeps a non-contiguous x's strides, which Comm refuses: fails for non-contiguous input."""
    return _ReduceCloneNoncontig.apply(x, comm)


class _ReduceSkipOne(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if comm.world_size == 1:
            return x.view_as(x)  # nothing to sum with
        out = x.contiguous().clone()
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def tp_reduce_skips_one_rank(x, comm):
    """WRONG: with one rank returns a view of x and calls no collective: text says a new tensor, one collective."""
    return _ReduceSkipOne.apply(x, comm)


class _GatherSliceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        n, r = ctx.comm.world_size, ctx.comm.rank
        rows = dy.shape[0] // n
        return dy[r * rows:(r + 1) * rows].clone(), None


def sp_gather_backward_slices(x, comm):
    """WRONG: backward takes the rank's rows of its own gradient, no reduce-scatter (misses other ranks' parts)."""
    return _GatherSliceBackward.apply(x, comm)


class _GatherAllReduceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        n, r = ctx.comm.world_size, ctx.comm.rank
        g = dy.contiguous().clone()
        ctx.comm.all_reduce(g)
        rows = dy.shape[0] // n
        return g[r * rows:(r + 1) * rows].clone(), None


def sp_gather_backward_all_reduce(x, comm):
    """WRONG: right values, but backward all-reduces the whole gradient then slices: the table says
    reduce_scatter (and twice its bytes are sent)."""
    return _GatherAllReduceBackward.apply(x, comm)


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x)
        return torch.cat(out.chunk(comm.world_size, dim=0), dim=-1)

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        full = torch.cat(dy.chunk(n, dim=-1), dim=0).contiguous()
        out = dy.new_empty((full.shape[0] // n, *full.shape[1:]))
        ctx.comm.reduce_scatter(out, full)
        return out, None


def sp_gather_last_dim(x, comm):
    """WRONG: concatenates the ranks' parts along the last dim (hidden), not dim 0 (the sequence)."""
    return _GatherLastDim.apply(x, comm)


class _GatherFp32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm, ctx.dtype = comm, x.dtype
        x32 = x.float().contiguous()
        out = x32.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x32)
        return out  # float32 whatever x's dtype

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        dy = dy.float().contiguous()
        out = dy.new_empty((dy.shape[0] // n, *dy.shape[1:]))
        ctx.comm.reduce_scatter(out, dy)
        return out.to(ctx.dtype), None


def sp_gather_fp32(x, comm):
    """WRONG: gathers in fp32 "for safety": the output is fp32 for a bf16/fp16 x, and twice the bytes are sent."""
    return _GatherFp32.apply(x, comm)


class _GatherFp32Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        d32 = dy.float().contiguous()
        out = d32.new_empty((dy.shape[0] // n, *dy.shape[1:]))
        ctx.comm.reduce_scatter(out, d32)  # sums in fp32: more bytes on the wire for half dtypes
        return out.to(dy.dtype), None


def sp_gather_fp32_grad_reduce(x, comm):
    """WRONG: reduce-scatters the gradient in fp32 for a half-precision x: twice the bytes (and other rounding
    from 3 ranks up); only the backward of bf16/fp16 differs."""
    return _GatherFp32Backward.apply(x, comm)


class _GatherCtxTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((comm.world_size * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x)
        ctx.out = out  # a tensor on ctx: output -> grad_fn -> ctx -> output, a cycle
        return out

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        dy = dy.contiguous()
        out = dy.new_empty((ctx.out.shape[0] // n, *dy.shape[1:]))
        ctx.comm.reduce_scatter(out, dy)
        return out, None


def sp_gather_ctx_keeps_output(x, comm):
    """WRONG: keeps its output tensor as a ctx attribute (not save_for_backward): a reference cycle that keeps
    the gathered activations alive after the graph is gone."""
    return _GatherCtxTensor.apply(x, comm)


class _ScatterTruncate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm, ctx.rows = comm, x.shape[0]
        n = comm.world_size
        keep = x[: n * (x.shape[0] // n)].contiguous()  # drops the rows that do not divide
        out = keep.new_empty((keep.shape[0] // n, *x.shape[1:]))
        comm.reduce_scatter(out, keep)
        return out

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        dy = dy.contiguous()
        out = dy.new_empty((n * dy.shape[0], *dy.shape[1:]))
        ctx.comm.all_gather(out, dy)
        if out.shape[0] < ctx.rows:
            out = torch.cat([out, out.new_zeros((ctx.rows - out.shape[0], *out.shape[1:]))])
        return out, None


def sp_scatter_truncates(x, comm):
    """WRONG: no ValueError for an uneven dim 0: silently drops the remainder rows."""
    return _ScatterTruncate.apply(x, comm)


class _ScatterAssert(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        assert x.shape[0] % comm.world_size == 0, "uneven sequence"
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // comm.world_size, *x.shape[1:]))
        comm.reduce_scatter(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        out = dy.new_empty((ctx.comm.world_size * dy.shape[0], *dy.shape[1:]))
        ctx.comm.all_gather(out, dy)
        return out, None


def sp_scatter_assert(x, comm):
    """WRONG: an assert (AssertionError) where the text asks for a ValueError."""
    return _ScatterAssert.apply(x, comm)


class _ScatterLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if x.shape[0] % comm.world_size:
            raise ValueError("uneven")
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((*x.shape[:-1], x.shape[-1] // comm.world_size))  # cuts the last dim
        comm.reduce_scatter(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        dy = dy.contiguous()
        out = dy.new_empty((*dy.shape[:-1], n * dy.shape[-1]))
        ctx.comm.all_gather(out, dy)
        return out, None


def sp_scatter_shape_last_dim(x, comm):
    """WRONG: sizes the output by cutting the last dim instead of dim 0: right numbers, wrong shape."""
    return _ScatterLastDim.apply(x, comm)


class _ScatterRepeatBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if x.shape[0] % comm.world_size:
            raise ValueError("uneven")
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // comm.world_size, *x.shape[1:]))
        comm.reduce_scatter(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        reps = (ctx.comm.world_size,) + (1,) * (dy.dim() - 1)
        return dy.repeat(*reps), None


def sp_scatter_backward_repeats(x, comm):
    """WRONG: backward tiles its own gradient world_size times: no all-gather of the other ranks' gradients."""
    return _ScatterRepeatBackward.apply(x, comm)


class _ScatterAllReduceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if x.shape[0] % comm.world_size:
            raise ValueError("uneven")
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // comm.world_size, *x.shape[1:]))
        comm.reduce_scatter(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        n, r = ctx.comm.world_size, ctx.comm.rank
        full = dy.new_zeros((n * dy.shape[0], *dy.shape[1:]))
        full[r * dy.shape[0]:(r + 1) * dy.shape[0]] = dy
        ctx.comm.all_reduce(full)  # zeros elsewhere: the sum is the concatenation
        return full, None


def sp_scatter_backward_all_reduce(x, comm):
    """WRONG: right gradient, built as an all-reduce of zero-padded parts: the table says all_gather (and the
    all-reduce sends twice the bytes)."""
    return _ScatterAllReduceBackward.apply(x, comm)


_SCATTER_BUFFERS: dict = {}


class _ScatterCachedBuffer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if x.shape[0] % comm.world_size:
            raise ValueError("uneven")
        ctx.comm = comm
        x = x.contiguous()
        key = (comm.rank, comm.world_size, tuple(x.shape), x.dtype, x.device)
        if key not in _SCATTER_BUFFERS:  # reuse the output buffer: no allocation per call
            _SCATTER_BUFFERS[key] = x.new_empty((x.shape[0] // comm.world_size, *x.shape[1:]))
        out = _SCATTER_BUFFERS[key]
        comm.reduce_scatter(out, x)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        out = dy.new_empty((ctx.comm.world_size * dy.shape[0], *dy.shape[1:]))
        ctx.comm.all_gather(out, dy)
        return out, None


def sp_scatter_reuses_buffer(x, comm):
    """WRONG: keeps its output buffer between calls: a second call of the same shape overwrites the first
    call's output (and the buffer stays alive after the step)."""
    return _ScatterCachedBuffer.apply(x, comm)


class _ScatterNoncontigBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        if x.shape[0] % comm.world_size:
            raise ValueError("uneven")
        ctx.comm = comm
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // comm.world_size, *x.shape[1:]))
        comm.reduce_scatter(out, x)
        return out

    @staticmethod
    def backward(ctx, dy):
        n = ctx.comm.world_size
        out = dy.new_empty((n * dy.shape[0], *dy.shape[1:]))
        ctx.comm.all_gather(out, dy)  # dy passed as it comes, maybe non-contiguous
        return out, None


def sp_scatter_grad_strides(x, comm):
    """WRONG: backward all-gathers the gradient as handed, without .contiguous(): the text says collectives run
    on contiguous tensors (a Comm that checks refuses a transposed gradient)."""
    return _ScatterNoncontigBackward.apply(x, comm)


# ============================================================================ shard_block (exercise 2)

def _check_shard_args(cfg, tp, rank):
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} outside 0..{tp - 1}")
    for name in ("n_heads", "n_kv_heads", "ffn_hidden"):
        if getattr(cfg, name) % tp:
            raise ValueError(f"tp={tp} does not divide {name}={getattr(cfg, name)}")


def shard_block_split_cat(params, cfg, tp, rank):
    """RIGHT: split wqkv into q, k, v and w13 into gate, up; slice each by the rank's heads/units; torch.cat
    (new memory) in the same order; wo and w2 by columns, cloned contiguous; norms cloned."""
    _check_shard_args(cfg, tp, rank)
    hd = cfg.head_dim
    qh, kvh, f = cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.ffn_hidden // tp
    wq, wk, wv = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    qr = slice(rank * qh * hd, (rank + 1) * qh * hd)
    kr = slice(rank * kvh * hd, (rank + 1) * kvh * hd)
    gate, up = params["w13"].split([cfg.ffn_hidden, cfg.ffn_hidden])
    fr = slice(rank * f, (rank + 1) * f)
    return {
        "norm1": params["norm1"].clone(),
        "wqkv": torch.cat([wq[qr], wk[kr], wv[kr]]),
        "wo": params["wo"][:, qr].clone(memory_format=torch.contiguous_format),
        "norm2": params["norm2"].clone(),
        "w13": torch.cat([gate[fr], up[fr]]),
        "w2": params["w2"][:, fr].clone(memory_format=torch.contiguous_format),
    }


def shard_block_index_select(params, cfg, tp, rank):
    """RIGHT: builds explicit row/column index lists and uses index_select (which always copies)."""
    if tp < 1 or rank < 0 or rank >= tp:
        raise ValueError("rank must be in 0..tp-1 and tp >= 1")
    if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
        raise ValueError("tp must divide n_heads, n_kv_heads and ffn_hidden")
    hd, dev = cfg.head_dim, params["wqkv"].device
    q_heads = range(rank * cfg.n_heads // tp, (rank + 1) * cfg.n_heads // tp)
    kv_heads = range(rank * cfg.n_kv_heads // tp, (rank + 1) * cfg.n_kv_heads // tp)
    q_rows = [h * hd + i for h in q_heads for i in range(hd)]
    k_rows = [cfg.q_dim + h * hd + i for h in kv_heads for i in range(hd)]
    v_rows = [cfg.q_dim + cfg.kv_dim + h * hd + i for h in kv_heads for i in range(hd)]
    per = cfg.ffn_hidden // tp
    units = list(range(rank * per, (rank + 1) * per))
    idx = lambda rows: torch.tensor(rows, dtype=torch.long, device=dev)  # noqa: E731
    return {
        "norm1": params["norm1"].index_select(0, idx(range(cfg.d_model))),
        "wqkv": params["wqkv"].index_select(0, idx(q_rows + k_rows + v_rows)),
        "wo": params["wo"].index_select(1, idx(q_rows)),
        "norm2": params["norm2"].index_select(0, idx(range(cfg.d_model))),
        "w13": params["w13"].index_select(0, idx(units + [cfg.ffn_hidden + u for u in units])),
        "w2": params["w2"].index_select(1, idx(units)),
    }


def shard_block_head_views(params, cfg, tp, rank):
    """RIGHT: views the weights by heads ((heads, head_dim, d_model)) and units, picks the rank's block of heads
    with chunk, then copies with .contiguous() on non-contiguous picks and .clone() otherwise."""
    _check_shard_args(cfg, tp, rank)
    h, hd = cfg.d_model, cfg.head_dim

    def own(t):
        t = t.contiguous()
        return t.clone() if any(t.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                                for p in params.values()) else t
    q, k, v = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    q = q.view(cfg.n_heads, hd, h).chunk(tp)[rank].reshape(-1, h)
    k = k.view(cfg.n_kv_heads, hd, h).chunk(tp)[rank].reshape(-1, h)
    v = v.view(cfg.n_kv_heads, hd, h).chunk(tp)[rank].reshape(-1, h)
    wo = params["wo"].view(h, cfg.n_heads, hd).chunk(tp, dim=1)[rank].reshape(h, -1)
    w13 = params["w13"].view(2, tp, cfg.ffn_hidden // tp, h)[:, rank].reshape(-1, h)
    w2 = params["w2"].chunk(tp, dim=1)[rank]
    return {"norm1": own(params["norm1"]), "wqkv": own(torch.cat([q, k, v])), "wo": own(wo),
            "norm2": own(params["norm2"]), "w13": own(w13), "w2": own(w2)}


def shard_block_empty_copy(params, cfg, tp, rank):
    """RIGHT: allocates each shard with torch.empty in params' dtype and device, and copy_s the pieces in."""
    if not (isinstance(tp, int) and tp >= 1 and isinstance(rank, int) and 0 <= rank < tp):
        raise ValueError("bad tp or rank")
    if any(n % tp for n in (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden)):
        raise ValueError("tp must divide the heads, the kv heads and ffn_hidden")
    like = params["wqkv"]
    new = lambda *shape: torch.empty(shape, dtype=like.dtype, device=like.device)  # noqa: E731
    h = cfg.d_model
    qd, kd, fd = cfg.q_dim // tp, cfg.kv_dim // tp, cfg.ffn_hidden // tp
    wqkv = new(qd + 2 * kd, h)
    wqkv[:qd] = params["wqkv"][rank * qd:(rank + 1) * qd]
    wqkv[qd:qd + kd] = params["wqkv"][cfg.q_dim + rank * kd:cfg.q_dim + (rank + 1) * kd]
    wqkv[qd + kd:] = params["wqkv"][cfg.q_dim + cfg.kv_dim + rank * kd:cfg.q_dim + cfg.kv_dim + (rank + 1) * kd]
    w13 = new(2 * fd, h)
    w13[:fd] = params["w13"][rank * fd:(rank + 1) * fd]
    w13[fd:] = params["w13"][cfg.ffn_hidden + rank * fd:cfg.ffn_hidden + (rank + 1) * fd]
    wo = new(h, qd)
    wo.copy_(params["wo"][:, rank * qd:(rank + 1) * qd])
    w2 = new(h, fd)
    w2.copy_(params["w2"][:, rank * fd:(rank + 1) * fd])
    norm1, norm2 = new(h), new(h)
    norm1.copy_(params["norm1"])
    norm2.copy_(params["norm2"])
    return {"norm1": norm1, "wqkv": wqkv, "wo": wo, "norm2": norm2, "w13": w13, "w2": w2}


def shard_block_contiguous_rows(params, cfg, tp, rank):
    """WRONG: takes a contiguous 1/t block of wqkv's rows (rank 0 gets query heads only)."""
    _check_shard_args(cfg, tp, rank)
    out = shard_block_split_cat(params, cfg, tp, rank)
    n = params["wqkv"].shape[0] // tp
    out["wqkv"] = params["wqkv"][rank * n:(rank + 1) * n].clone()
    return out


def shard_block_w13_contiguous_rows(params, cfg, tp, rank):
    """WRONG: w13 cut as one contiguous block of rows: rank 0 gets gate rows only, the last rank up rows only."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    n = params["w13"].shape[0] // tp
    out["w13"] = params["w13"][rank * n:(rank + 1) * n].clone()
    return out


def shard_block_wo_rows(params, cfg, tp, rank):
    """WRONG: wo cut by rows like a column-parallel weight: row-parallel wo keeps the rank's columns."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    n = params["wo"].shape[0] // tp
    out["wo"] = params["wo"][rank * n:(rank + 1) * n].clone()
    return out


def shard_block_w2_rows(params, cfg, tp, rank):
    """WRONG: w2 cut by rows: it must keep the columns of the rank's ffn units."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    n = params["w2"].shape[0] // tp
    out["w2"] = params["w2"][rank * n:(rank + 1) * n].clone()
    return out


def shard_block_up_then_gate(params, cfg, tp, rank):
    """WRONG: stacks the rank's up rows before its gate rows (w13 keeps gate first, then up)."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    f = cfg.ffn_hidden // tp
    out["w13"] = torch.cat([out["w13"][f:], out["w13"][:f]])
    return out


def shard_block_strided_heads(params, cfg, tp, rank):
    """WRONG: round-robin heads (rank r takes heads r, r+t, ...) and kv heads likewise: text says rank r takes
    the contiguous heads r·n_heads/t ... (for GQA with several kv heads per rank the groups no longer match)."""
    _check_shard_args(cfg, tp, rank)
    hd, h = cfg.head_dim, cfg.d_model
    q, k, v = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    q = q.view(cfg.n_heads, hd, h)[rank::tp].reshape(-1, h)
    k = k.view(cfg.n_kv_heads, hd, h)[rank::tp].reshape(-1, h)
    v = v.view(cfg.n_kv_heads, hd, h)[rank::tp].reshape(-1, h)
    wo = params["wo"].view(h, cfg.n_heads, hd)[:, rank::tp].reshape(h, -1)
    out = shard_block_split_cat(params, cfg, tp, rank)
    out["wqkv"] = torch.cat([q, k, v])
    out["wo"] = wo.contiguous() if not wo.is_contiguous() else wo.clone()
    return out


def shard_block_megatron_groups(params, cfg, tp, rank):
    """WRONG: Megatron's grouped layout (each kv group's query heads, then its k, then its v, group by group):
    the text says the rank's q rows, then k rows, then v rows. Same as right when a rank holds one kv head."""
    _check_shard_args(cfg, tp, rank)
    hd, h = cfg.head_dim, cfg.d_model
    group = cfg.n_heads // cfg.n_kv_heads
    q, k, v = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    q, k, v = q.view(cfg.n_heads, hd, h), k.view(cfg.n_kv_heads, hd, h), v.view(cfg.n_kv_heads, hd, h)
    per = cfg.n_kv_heads // tp
    parts = []
    for g in range(rank * per, (rank + 1) * per):
        parts += [q[g * group:(g + 1) * group].reshape(-1, h), k[g], v[g]]
    out = shard_block_split_cat(params, cfg, tp, rank)
    out["wqkv"] = torch.cat(parts)
    return out


def shard_block_q_heads_for_kv(params, cfg, tp, rank):
    """WRONG: k and v take the same head range as q (n_heads/t heads): right only without GQA."""
    _check_shard_args(cfg, tp, rank)
    hd = cfg.head_dim
    qh = cfg.n_heads // tp
    wq, wk, wv = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    r = slice(rank * qh * hd, (rank + 1) * qh * hd)
    out = shard_block_split_cat(params, cfg, tp, rank)
    out["wqkv"] = torch.cat([wq[r], wk[r], wv[r]])
    return out


def shard_block_d_model_for_q(params, cfg, tp, rank):
    """WRONG: sizes the rank's q rows and wo columns as d_model/t instead of q_dim/t (n_heads/t heads of
    head_dim): wrong when head_dim is overridden (q_dim != d_model)."""
    _check_shard_args(cfg, tp, rank)
    qd, kd = cfg.d_model // tp, cfg.kv_dim // tp
    wq, wk, wv = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    out = shard_block_split_cat(params, cfg, tp, rank)
    out["wqkv"] = torch.cat([wq[rank * qd:(rank + 1) * qd], wk[rank * kd:(rank + 1) * kd],
                             wv[rank * kd:(rank + 1) * kd]])
    out["wo"] = params["wo"][:, rank * qd:(rank + 1) * qd].clone(memory_format=torch.contiguous_format)
    return out


def shard_block_norm_views(params, cfg, tp, rank):
    """WRONG: the norms are handed back as the params' own tensors (not copies): not in their own memory."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    out["norm1"], out["norm2"] = params["norm1"], params["norm2"]
    return out


def shard_block_contiguous_view_tp1(params, cfg, tp, rank):
    """WRONG: .contiguous() on the column slices of wo and w2: at tp=1 the slice is the whole contiguous weight,
    so .contiguous() returns a view of params (own memory only for tp > 1)."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    q, f = cfg.q_dim // tp, cfg.ffn_hidden // tp
    out["wo"] = params["wo"][:, rank * q:(rank + 1) * q].contiguous()
    out["w2"] = params["w2"][:, rank * f:(rank + 1) * f].contiguous()
    return out


def shard_block_transposed_w2(params, cfg, tp, rank):
    """WRONG: w2 and wo transposed to a contiguous copy, their rows taken, transposed back: right values but not
    contiguous, and each keeps alive the whole transposed weight (the storage of the full copy)."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    out["w2"] = params["w2"].T.contiguous().chunk(tp)[rank].T
    out["wo"] = params["wo"].T.contiguous().chunk(tp)[rank].T
    return out


def shard_block_fp32(params, cfg, tp, rank):
    """WRONG: allocates the shard with torch.empty's defaults (fp32, CPU) and copies in: wrong dtype for bf16
    params (and wrong device for GPU params)."""
    out = shard_block_split_cat(params, cfg, tp, rank)
    res = {}
    for name, t in out.items():
        res[name] = torch.empty(t.shape)
        res[name].copy_(t)
    return res


def shard_block_negative_rank(params, cfg, tp, rank):
    """WRONG: checks only rank >= tp: a negative rank silently gives the last ranks' slices."""
    if tp < 1 or rank >= tp:
        raise ValueError("rank")
    if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
        raise ValueError("tp")
    hd = cfg.head_dim
    qh, kvh, f = cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.ffn_hidden // tp
    wq, wk, wv = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    gate, up = params["w13"].split([cfg.ffn_hidden, cfg.ffn_hidden])
    pick = lambda t, n, dim=0: t.chunk(tp, dim=dim)[rank]  # noqa: E731  (negative rank: from the end)
    return {"norm1": params["norm1"].clone(), "norm2": params["norm2"].clone(),
            "wqkv": torch.cat([pick(wq, qh), pick(wk, kvh), pick(wv, kvh)]),
            "wo": pick(params["wo"], qh, 1).clone(memory_format=torch.contiguous_format),
            "w13": torch.cat([pick(gate, f), pick(up, f)]),
            "w2": pick(params["w2"], f, 1).clone(memory_format=torch.contiguous_format)}


def shard_block_no_kv_check(params, cfg, tp, rank):
    """WRONG: checks n_heads and ffn_hidden but not n_kv_heads: tp > n_kv_heads gives empty k and v (text:
    refused with ValueError)."""
    if tp < 1 or not 0 <= rank < tp or cfg.n_heads % tp or cfg.ffn_hidden % tp:
        raise ValueError("bad tp/rank")
    hd = cfg.head_dim
    qh, kvh, f = cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.ffn_hidden // tp
    wq, wk, wv = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    qr = slice(rank * qh * hd, (rank + 1) * qh * hd)
    kr = slice(rank * kvh * hd, (rank + 1) * kvh * hd)
    gate, up = params["w13"].split([cfg.ffn_hidden, cfg.ffn_hidden])
    fr = slice(rank * f, (rank + 1) * f)
    return {"norm1": params["norm1"].clone(), "wqkv": torch.cat([wq[qr], wk[kr], wv[kr]]),
            "wo": params["wo"][:, qr].clone(memory_format=torch.contiguous_format),
            "norm2": params["norm2"].clone(), "w13": torch.cat([gate[fr], up[fr]]),
            "w2": params["w2"][:, fr].clone(memory_format=torch.contiguous_format)}


def shard_block_no_ffn_check(params, cfg, tp, rank):
    """WRONG: no check that tp divides ffn_hidden: floor division silently drops FFN units."""
    if tp < 1 or not 0 <= rank < tp or cfg.n_heads % tp or cfg.n_kv_heads % tp:
        raise ValueError("bad tp/rank")
    hd = cfg.head_dim
    qh, kvh, f = cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.ffn_hidden // tp
    wq, wk, wv = params["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    qr = slice(rank * qh * hd, (rank + 1) * qh * hd)
    kr = slice(rank * kvh * hd, (rank + 1) * kvh * hd)
    gate, up = params["w13"].split([cfg.ffn_hidden, cfg.ffn_hidden])
    fr = slice(rank * f, (rank + 1) * f)
    return {"norm1": params["norm1"].clone(), "wqkv": torch.cat([wq[qr], wk[kr], wv[kr]]),
            "wo": params["wo"][:, qr].clone(memory_format=torch.contiguous_format),
            "norm2": params["norm2"].clone(), "w13": torch.cat([gate[fr], up[fr]]),
            "w2": params["w2"][:, fr].clone(memory_format=torch.contiguous_format)}


def shard_block_tp0_zero_division(params, cfg, tp, rank):
    """WRONG: tests divisibility before the rank, so tp=0 raises ZeroDivisionError, not ValueError (rank is not
    in the empty range 0..tp-1)."""
    if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
        raise ValueError("tp must divide the heads and ffn_hidden")
    if not 0 <= rank < tp:
        raise ValueError("rank")
    return shard_block_split_cat(params, cfg, tp, rank)


_SHARD_CACHE: dict = {}


def shard_block_cached(params, cfg, tp, rank):
    """WRONG: caches shards by (cfg, tp, rank), ignoring params: keeps state between calls, so a second block's
    weights (another seed) get the first block's shard."""
    key = (repr(cfg), tp, rank, params["wqkv"].dtype)
    if key not in _SHARD_CACHE:
        _SHARD_CACHE[key] = shard_block_split_cat(params, cfg, tp, rank)
    return _SHARD_CACHE[key]


# ============================================================================ tp_block (exercise 3)

def _ops(sp):
    return (sp_gather, sp_scatter) if sp else (tp_copy, tp_reduce)


def tp_block_plain(x, shard, cfg, comm, rope, sequence_parallel=False):
    """RIGHT: the block as the text writes it, with full_block's exact ops on the rank's heads."""
    f, g = _ops(sequence_parallel)
    t = comm.world_size
    nh, nkv, hd = cfg.n_heads // t, cfg.n_kv_heads // t, cfg.head_dim
    cos, sin = rope
    a = f(rms_norm(x, shard["norm1"], cfg.norm_eps), comm)
    s, b, _ = a.shape
    q, k, v = (a @ shard["wqkv"].T).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = apply_rope(q.reshape(s, b, nh, hd), cos, sin)
    k = apply_rope(k.reshape(s, b, nkv, hd), cos, sin)
    v = v.reshape(s, b, nkv, hd)
    group = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    y = F.scaled_dot_product_attention(*(z.permute(1, 2, 0, 3) for z in (q, k, v)), is_causal=True)
    x = x + g(y.permute(2, 0, 1, 3).reshape(s, b, nh * hd) @ shard["wo"].T, comm)
    gate, up = (f(rms_norm(x, shard["norm2"], cfg.norm_eps), comm) @ shard["w13"].T).chunk(2, dim=-1)
    return x + g(swiglu(gate, up) @ shard["w2"].T, comm)


def tp_block_sublayers(x, shard, cfg, comm, rope, sequence_parallel=False):
    """RIGHT: attention and MLP as helper functions; kv heads repeated by expand + reshape (the same order as
    repeat_interleave), the operators chosen by an if in each sublayer."""
    t = comm.world_size
    hd = cfg.head_dim
    nh, nkv = cfg.n_heads // t, cfg.n_kv_heads // t

    def enter(z):
        return sp_gather(z, comm) if sequence_parallel else tp_copy(z, comm)

    def leave(z):
        return sp_scatter(z, comm) if sequence_parallel else tp_reduce(z, comm)

    def attention(h_in):
        s, b, _ = h_in.shape
        qkv = h_in @ shard["wqkv"].T
        q = qkv[..., :nh * hd].reshape(s, b, nh, hd)
        k = qkv[..., nh * hd:(nh + nkv) * hd].reshape(s, b, nkv, hd)
        v = qkv[..., (nh + nkv) * hd:].reshape(s, b, nkv, hd)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        rep = nh // nkv
        k = k[:, :, :, None].expand(s, b, nkv, rep, hd).reshape(s, b, nh, hd)
        v = v[:, :, :, None].expand(s, b, nkv, rep, hd).reshape(s, b, nh, hd)
        y = F.scaled_dot_product_attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                                           is_causal=True)
        return y.permute(2, 0, 1, 3).reshape(s, b, nh * hd) @ shard["wo"].T

    def mlp(h_in):
        gate, up = (h_in @ shard["w13"].T).split(cfg.ffn_hidden // t, dim=-1)
        return swiglu(gate, up) @ shard["w2"].T

    h1 = x + leave(attention(enter(rms_norm(x, shard["norm1"], cfg.norm_eps))))
    return h1 + leave(mlp(enter(rms_norm(h1, shard["norm2"], cfg.norm_eps))))


def tp_block_separate_matmuls(x, shard, cfg, comm, rope, sequence_parallel=False):
    """RIGHT (to rounding): splits the weights instead of the outputs (three q/k/v matmuls, two for gate/up) and
    lets scaled_dot_product_attention map heads to kv heads (enable_gqa: head i reads kv head i // group)."""
    f, g = _ops(sequence_parallel)
    t = comm.world_size
    nh, nkv, hd = cfg.n_heads // t, cfg.n_kv_heads // t, cfg.head_dim
    wq, wk, wv = shard["wqkv"].split([nh * hd, nkv * hd, nkv * hd])
    a = f(rms_norm(x, shard["norm1"], cfg.norm_eps), comm)
    s, b, _ = a.shape
    q = apply_rope((a @ wq.T).view(s, b, nh, hd), *rope).permute(1, 2, 0, 3)
    k = apply_rope((a @ wk.T).view(s, b, nkv, hd), *rope).permute(1, 2, 0, 3)
    v = (a @ wv.T).view(s, b, nkv, hd).permute(1, 2, 0, 3)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + g(y.permute(2, 0, 1, 3).flatten(2) @ shard["wo"].T, comm)
    w1, w3 = shard["w13"].chunk(2)
    m = f(rms_norm(x, shard["norm2"], cfg.norm_eps), comm)
    return x + g(swiglu(m @ w1.T, m @ w3.T) @ shard["w2"].T, comm)


def _block_variant(x, shard, cfg, comm, rope, sp, *, f_before_norm=False, sp_norm_on_gathered=False,
                   skip_f_mlp=False, skip_f=False, repeat_tile=False, equal_split=False, causal=True,
                   transpose_out=False, swap_swiglu=False, eps=None, divide_g=False, rope_v=False,
                   norm_weight_copy=False, sp_all_reduce_g=False, fp32_residual=False, scale=None):
    f, g = _ops(sp)
    t = comm.world_size
    nh, nkv, hd = cfg.n_heads // t, cfg.n_kv_heads // t, cfg.head_dim
    eps = cfg.norm_eps if eps is None else eps
    cos, sin = rope
    dtype = x.dtype
    if fp32_residual:
        x = x.float()

    def enter(z, weight, mlp=False):
        if norm_weight_copy and sp:
            weight = tp_copy(weight, comm)
        if skip_f or (skip_f_mlp and mlp):
            return rms_norm(z.to(dtype), weight, eps)
        if f_before_norm or (sp and sp_norm_on_gathered):
            return rms_norm(f(z.to(dtype), comm), weight, eps)
        return f(rms_norm(z.to(dtype), weight, eps), comm)

    def leave(z):
        if sp and sp_all_reduce_g:
            n, r = comm.world_size, comm.rank
            rows = z.shape[0] // n
            return tp_reduce(z, comm)[r * rows:(r + 1) * rows]
        out = g(z, comm)
        return out / t if divide_g else out

    a = enter(x, shard["norm1"])
    s, b, _ = a.shape
    sizes = [shard["wqkv"].shape[0] // 3] * 3 if equal_split else [nh * hd, nkv * hd, nkv * hd]
    q, k, v = (a @ shard["wqkv"].T).split(sizes, dim=-1)
    q = apply_rope(q.reshape(s, b, nh, hd), cos, sin)
    k = apply_rope(k.reshape(s, b, -1, hd), cos, sin)
    v = v.reshape(s, b, -1, hd)
    if rope_v:
        v = apply_rope(v, cos, sin)
    group = nh // k.shape[2]
    if repeat_tile:
        k, v = k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1)
    else:
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    kw = {} if scale is None else {"scale": scale}
    y = F.scaled_dot_product_attention(*(z.permute(1, 2, 0, 3) for z in (q, k, v)), is_causal=causal, **kw)
    if transpose_out:
        y = y.transpose(1, 2).reshape(s, b, nh * hd)  # (b, s, heads, d) read as (s, b, ...)
    else:
        y = y.permute(2, 0, 1, 3).reshape(s, b, nh * hd)
    x = x + leave(y @ shard["wo"].T)
    gate, up = (enter(x, shard["norm2"], mlp=True) @ shard["w13"].T).chunk(2, dim=-1)
    act = swiglu(up, gate) if swap_swiglu else swiglu(gate, up)
    return x + leave(act @ shard["w2"].T)


def tp_block_f_before_norm(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: f applied to the norm's input, not its output: with plain TP each rank's norm weights get only its
    own partial gradient (text: every shard tensor gets the unsharded block's gradient); under SP the norms run
    on the gathered sequence."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, f_before_norm=True)


def tp_block_sp_norm_after_gather(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG (SP only): gathers the sequence before the norms: the norms run on every token (their weights see
    every token's partial gradient), not on the rank's rows as the text says; output and x's gradient right."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, sp_norm_on_gathered=True)


def tp_block_no_f(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: no f in plain TP (norm output used directly): forward right, but x's gradient lacks the other
    ranks' heads and units. Under SP it would not even gather; shapes break."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, skip_f=True)


def tp_block_no_f_mlp(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: forgets f before the MLP in plain TP: only backward is wrong (x's gradient misses the other ranks'
    ffn units, and norm2's gradient is partial)."""
    if sequence_parallel:
        return tp_block_plain(x, shard, cfg, comm, rope, True)
    return _block_variant(x, shard, cfg, comm, rope, False, skip_f_mlp=True)


def tp_block_repeat_tiles_kv(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: k.repeat (tiles kv heads 0,1,0,1) instead of repeat_interleave (0,0,1,1): query head i must read kv
    head i // group; wrong only with GQA and several kv heads per rank."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, repeat_tile=True)


def tp_block_equal_thirds(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: splits wqkv's output in three equal parts: right only without GQA (q wider than k, v otherwise)."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, equal_split=True)


def tp_block_not_causal(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: attention without the causal mask."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, causal=False)


def tp_block_transpose_reshape(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: attention's output transposed to (batch, seq, heads, d) and reshaped as (seq, batch, ...): right
    only for batch 1."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, transpose_out=True)


def tp_block_swiglu_swapped(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: swiglu(up, gate): silu on the up half; w13 is gate rows then up rows."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, swap_swiglu=True)


def tp_block_default_eps(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: RMSNorm's eps hard-coded 1e-6 instead of cfg.norm_eps (1e-5): small, systematic differences."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, eps=1e-6)


def tp_block_mean_g(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: divides g's sum by world_size (a mean): the partial sums of every rank's heads must be added."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, divide_g=True)


def tp_block_rope_on_v(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: rotates v too: RoPE is applied to q and k only."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, rope_v=True)


def tp_block_sp_allreduce_norm_weights(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG (SP only): passes the norm weights through tp_copy so their gradient is all-reduced in backward:
    extra collectives, and the per-rank gradients then sum to t times the full one (text: summed over ranks)."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, norm_weight_copy=True)


def tp_block_sp_all_reduce_then_slice(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG (SP only): g as tp_reduce (all-reduce) then the rank's rows: right values, but the text says g is
    sp_scatter (a reduce-scatter); twice the bytes, and g's identity backward then hands each partial only the
    rank's rows of the gradient (no all-gather), so the weights' and x's gradients are wrong."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, sp_all_reduce_g=True)


def tp_block_fp32_residual(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: keeps the residual stream in fp32 (Megatron's fp32_residual_connection): output fp32 for a bf16 x;
    text says in x's dtype."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, fp32_residual=True)


def tp_block_d_model_scale(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG: attention scaled by 1/sqrt(d_model) instead of sdpa's default 1/sqrt(head_dim)."""
    return _block_variant(x, shard, cfg, comm, rope, sequence_parallel, scale=cfg.d_model ** -0.5)


def tp_block_global_rank_rope(x, shard, cfg, comm, rope, sequence_parallel=False):
    """WRONG (SP only): offsets RoPE's positions by the rank's first row (as if q held the rank's tokens only):
    after the gather every rank holds the whole sequence, positions 0..seq-1; text: rope is for the whole sequence."""
    if not sequence_parallel:
        return tp_block_plain(x, shard, cfg, comm, rope, False)
    cos, sin = rope
    shift = comm.rank * x.shape[0]
    return tp_block_plain(x, shard, cfg, comm, (cos.roll(-shift, 0), sin.roll(-shift, 0)), True)


# ============================================================================ tp_activation_bytes (exercise 4)

def _check_act(cfg, seq, tp, sequence_parallel, recompute):
    if recompute not in ("none", "full"):
        raise ValueError(f"recompute must be 'none' or 'full', got {recompute!r}")
    if tp < 1 or cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
        raise ValueError(f"tp={tp} must divide n_heads, n_kv_heads and ffn_hidden")
    if sequence_parallel and seq % tp:
        raise ValueError(f"seq={seq} is not a multiple of tp={tp}")


def tp_activation_bytes_table(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """RIGHT: the table's rows, one by one."""
    _check_act(cfg, seq, tp, sequence_parallel, recompute)
    h, T = cfg.d_model, seq * batch
    L = T // tp if sequence_parallel else T
    if recompute == "full":
        return dtype_bytes * L * h
    q, f = cfg.q_dim // tp, cfg.ffn_hidden // tp
    elements = 2 * L * h + 2 * (L + L * h) + 2 * T * h + 4 * T * q + 4 * T * f
    return dtype_bytes * elements + 4 * T * cfg.n_heads // tp


def tp_activation_bytes_factored(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """RIGHT: the same count, grouped by who shards it: L·(4h + 2) residual-side, T·(2h + 4q + 4f) matmul-side."""
    if recompute not in {"none", "full"}:
        raise ValueError("recompute")
    if tp <= 0 or any(n % tp for n in (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden)):
        raise ValueError("tp")
    if sequence_parallel and seq % tp != 0:
        raise ValueError("seq")
    tokens = seq * batch
    local = tokens // tp if sequence_parallel else tokens
    if recompute == "full":
        return local * cfg.d_model * dtype_bytes
    residual_side = local * (4 * cfg.d_model + 2)
    matmul_side = tokens * (2 * cfg.d_model + 4 * (cfg.q_dim + cfg.ffn_hidden) // tp)
    return dtype_bytes * (residual_side + matmul_side) + 4 * (tokens * cfg.n_heads // tp)


def tp_activation_bytes_terms(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """RIGHT: a dict of named terms in bytes, summed (seq/t rows per rank, times batch)."""
    _check_act(cfg, seq, tp, sequence_parallel, recompute)
    rows = (seq // tp if sequence_parallel else seq) * batch
    T, h, e = seq * batch, cfg.d_model, dtype_bytes
    if recompute == "full":
        return e * rows * h
    terms = {
        "input and norm2 input": 2 * rows * h * e,
        "norms' 1/rms": 2 * rows * e,
        "norms' normalized inputs": 2 * rows * h * e,
        "wqkv and w13 inputs": 2 * T * h * e,
        "q, k, v, attention out": 4 * T * (cfg.n_heads // tp) * cfg.head_dim * e,
        "gate, up, silu, product": 4 * T * (cfg.ffn_hidden // tp) * e,
        "lse": 4 * T * (cfg.n_heads // tp),
    }
    return int(sum(terms.values()))


def _act(cfg, seq, batch, tp, sp, recompute, e, *, lse_bytes=4, lse_div=True, lse=True, matmul_local=False,
         rms=True, qkvo=4, kv_at_kv_heads=False, ffn=4, full_T=False, full_plus=False, forget_batch_L=False,
         residual_T=False, q_undivided=False, rms_bytes=None, q_from_d_model=False, check_recompute=True,
         check_seq=True, check_kv=True, seq_check_always=False):
    if check_recompute and recompute not in ("none", "full"):
        raise ValueError("recompute")
    if tp < 1 or cfg.n_heads % tp or cfg.ffn_hidden % tp or (check_kv and cfg.n_kv_heads % tp):
        raise ValueError("tp")
    if (sp or seq_check_always) and check_seq and seq % tp:
        raise ValueError("seq")
    h, T = cfg.d_model, seq * batch
    L = (seq // tp if forget_batch_L else T // tp) if sp else T
    R = T if residual_T else L
    if recompute == "full" and not full_plus:
        return e * (T if full_T else L) * h
    q = (cfg.d_model if q_from_d_model else cfg.q_dim) // (1 if q_undivided else tp)
    f = cfg.ffn_hidden // tp
    M = L if matmul_local else T
    attn = qkvo * T * q
    if kv_at_kv_heads:
        attn = 2 * T * q + 2 * T * cfg.kv_dim // tp
    rb = e if rms_bytes is None else rms_bytes
    total = e * (2 * R * h + 2 * L * h + 2 * M * h + attn + ffn * T * f) + (2 * L * rb if rms else 0)
    if lse:
        total += lse_bytes * T * cfg.n_heads // (tp if lse_div else 1)
    if full_plus and recompute == "full":
        total += e * L * h
    return total


def tp_activation_bytes_lse_dtype(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: the log-sum-exp counted in the activations' dtype (e bytes), not fp32's 4."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, lse_bytes=dtype_bytes)


def tp_activation_bytes_no_lse(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: leaves out attention's log-sum-exp row of the table."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, lse=False)


def tp_activation_bytes_lse_all_heads(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: the log-sum-exp for every head (T·n_heads), not the rank's n_heads/t."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, lse_div=False)


def tp_activation_bytes_megatron_inputs(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: under SP counts the matmul inputs as the rank's rows (L·h, Megatron's further step): the table says
    every token, gathered (T·h)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, matmul_local=True)


def tp_activation_bytes_no_inv_rms(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: forgets each norm's 1/rms (L elements per norm)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, rms=False)


def tp_activation_bytes_three_attention(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: 3·T·q for q, k, v: forgets attention's output (wo's input)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, qkvo=3)


def tp_activation_bytes_kv_unrepeated(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: k and v counted at the rank's kv heads (kv_dim/t): the table counts them repeated to the query
    heads; wrong only with GQA."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, kv_at_kv_heads=True)


def tp_activation_bytes_three_ffn(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: 3·T·f for the MLP: forgets silu(gate) (gate and up, product only)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, ffn=3)


def tp_activation_bytes_full_whole_input(cfg, seq, batch, tp, sequence_parallel, recompute="none",
                                         dtype_bytes=2):
    """WRONG: full recomputation keeps the whole T·h input even under SP (text: e·L·h, the rank's rows)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, full_T=True)


def tp_activation_bytes_full_plus_rebuild(cfg, seq, batch, tp, sequence_parallel, recompute="none",
                                          dtype_bytes=2):
    """WRONG: for "full" returns one block's whole activations plus the input (the section-7 peak rule), not
    what the block keeps from forward to backward (e·L·h)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, full_plus=True)


def tp_activation_bytes_L_without_batch(cfg, seq, batch, tp, sequence_parallel, recompute="none",
                                        dtype_bytes=2):
    """WRONG: under SP, L = seq/t (forgets the batch): wrong for batch > 1 with SP."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, forget_batch_L=True)


def tp_activation_bytes_residual_whole(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: block input and norm2 input counted whole (2·T·h) under SP: SP keeps the rank's rows (2·L·h)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, residual_T=True)


def tp_activation_bytes_q_undivided(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: uses q_dim for q instead of q_dim/t: attention's tensors not split by TP."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, q_undivided=True)


def tp_activation_bytes_rms_fp32(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: 1/rms counted as fp32 (4 bytes): the table has e bytes for all but the log-sum-exp."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, rms_bytes=4)


def tp_activation_bytes_q_from_d_model(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: q = d_model/t instead of q_dim/t: wrong when head_dim is overridden."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, q_from_d_model=True)


def tp_activation_bytes_no_recompute_check(cfg, seq, batch, tp, sequence_parallel, recompute="none",
                                           dtype_bytes=2):
    """WRONG: anything other than "full" counted as "none" (no ValueError for e.g. "selective")."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, check_recompute=False)


def tp_activation_bytes_no_seq_check(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: no ValueError for a seq that tp does not divide under SP (floor division)."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, check_seq=False)


def tp_activation_bytes_no_kv_check(cfg, seq, batch, tp, sequence_parallel, recompute="none", dtype_bytes=2):
    """WRONG: no ValueError for a tp that does not divide n_kv_heads."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, check_kv=False)


def tp_activation_bytes_seq_check_always(cfg, seq, batch, tp, sequence_parallel, recompute="none",
                                         dtype_bytes=2):
    """WRONG: refuses a seq that tp does not divide even without SP: the text asks for it only with SP."""
    return _act(cfg, seq, batch, tp, sequence_parallel, recompute, dtype_bytes, seq_check_always=True)


# =============================================================================================== tables

def _ops4(copy="ref", reduce="ref", gather="ref", scatter="ref"):
    return {"tp_copy": copy, "tp_reduce": reduce, "sp_gather": gather, "sp_scatter": scatter}


BLIND = {
    "conjugate_ops": {
        "wrong": [
            _ops4(copy="tp_copy_no_backward_reduce"),
            _ops4(copy="tp_copy_inplace_grad"),
            _ops4(copy="tp_copy_mean_grad"),
            _ops4(copy="tp_copy_noncontiguous_grad"),
            _ops4(reduce="tp_reduce_writes_input"),
            _ops4(reduce="tp_reduce_backward_all_reduce"),
            _ops4(reduce="tp_reduce_mean"),
            _ops4(reduce="tp_reduce_noncontiguous"),
            _ops4(reduce="tp_reduce_skips_one_rank"),
            _ops4(gather="sp_gather_backward_slices"),
            _ops4(gather="sp_gather_backward_all_reduce"),
            _ops4(gather="sp_gather_last_dim"),
            _ops4(gather="sp_gather_fp32"),
            _ops4(gather="sp_gather_fp32_grad_reduce"),
            _ops4(gather="sp_gather_ctx_keeps_output"),
            _ops4(scatter="sp_scatter_truncates"),
            _ops4(scatter="sp_scatter_assert"),
            _ops4(scatter="sp_scatter_shape_last_dim"),
            _ops4(scatter="sp_scatter_backward_repeats"),
            _ops4(scatter="sp_scatter_backward_all_reduce"),
            _ops4(scatter="sp_scatter_reuses_buffer"),
            _ops4(scatter="sp_scatter_grad_strides"),
            # one wrong operator among three right ones of this file
            _ops4("tp_copy_plain", "tp_reduce_plain", "sp_gather_plain", "sp_scatter_truncates"),
        ],
        "right": [
            _ops4("tp_copy_plain", "tp_reduce_plain", "sp_gather_plain", "sp_scatter_plain"),
            _ops4("tp_copy_flat", "tp_reduce_flat", "sp_gather_flat", "sp_scatter_flat"),
            _ops4("tp_copy_plain", "tp_reduce_empty_like", "sp_gather_saved_shape", "sp_scatter_flat"),
            _ops4(scatter="sp_scatter_plain"),
        ],
    },
    "shard_block": {
        "wrong": ["shard_block_contiguous_rows", "shard_block_w13_contiguous_rows", "shard_block_wo_rows",
                  "shard_block_w2_rows", "shard_block_up_then_gate", "shard_block_strided_heads",
                  "shard_block_megatron_groups", "shard_block_q_heads_for_kv", "shard_block_d_model_for_q",
                  "shard_block_norm_views", "shard_block_contiguous_view_tp1", "shard_block_transposed_w2",
                  "shard_block_fp32", "shard_block_negative_rank", "shard_block_no_kv_check",
                  "shard_block_no_ffn_check", "shard_block_tp0_zero_division", "shard_block_cached"],
        "right": ["shard_block_split_cat", "shard_block_index_select", "shard_block_head_views",
                  "shard_block_empty_copy"],
    },
    "tp_block": {
        "wrong": ["tp_block_f_before_norm", "tp_block_sp_norm_after_gather", "tp_block_no_f", "tp_block_no_f_mlp",
                  "tp_block_repeat_tiles_kv", "tp_block_equal_thirds", "tp_block_not_causal",
                  "tp_block_transpose_reshape", "tp_block_swiglu_swapped", "tp_block_default_eps",
                  "tp_block_mean_g", "tp_block_rope_on_v", "tp_block_sp_allreduce_norm_weights",
                  "tp_block_sp_all_reduce_then_slice", "tp_block_fp32_residual", "tp_block_d_model_scale",
                  "tp_block_global_rank_rope"],
        "right": ["tp_block_plain", "tp_block_sublayers", "tp_block_separate_matmuls"],
    },
    "tp_activation_bytes": {
        "wrong": ["tp_activation_bytes_lse_dtype", "tp_activation_bytes_no_lse", "tp_activation_bytes_lse_all_heads",
                  "tp_activation_bytes_megatron_inputs", "tp_activation_bytes_no_inv_rms",
                  "tp_activation_bytes_three_attention", "tp_activation_bytes_kv_unrepeated",
                  "tp_activation_bytes_three_ffn", "tp_activation_bytes_full_whole_input",
                  "tp_activation_bytes_full_plus_rebuild", "tp_activation_bytes_L_without_batch",
                  "tp_activation_bytes_residual_whole", "tp_activation_bytes_q_undivided",
                  "tp_activation_bytes_rms_fp32", "tp_activation_bytes_q_from_d_model",
                  "tp_activation_bytes_no_recompute_check", "tp_activation_bytes_no_seq_check",
                  "tp_activation_bytes_no_kv_check", "tp_activation_bytes_seq_check_always"],
        "right": ["tp_activation_bytes_table", "tp_activation_bytes_factored", "tp_activation_bytes_terms"],
    },
}

WHY = {
    # conjugate_ops: right
    "tp_copy_plain": "f: view forward, all-reduce of a contiguous copy of the gradient (never dy itself)",
    "tp_reduce_plain": "g: contiguous clone all-reduced (new tensor, input untouched), identity backward",
    "sp_gather_plain": "all_gather into (t·n, ...) in rank order; reduce_scatter of a contiguous gradient",
    "sp_scatter_plain": "ValueError on uneven dim 0; reduce_scatter forward, all_gather backward",
    "tp_copy_flat": "a clone forward is 'x, unchanged'; all-reduce of a fresh flat buffer in backward",
    "tp_reduce_flat": "flat copy all-reduced then viewed to x's shape: new tensor, one all_reduce",
    "sp_gather_flat": "same collectives on flat 1-D buffers, viewed to shape",
    "sp_scatter_flat": "divmod check, flat reduce_scatter/all_gather",
    "sp_gather_saved_shape": "keeps x's shape (ints) on ctx and reduce-scatters straight into that shape",
    "tp_reduce_empty_like": "empty_like(contiguous)+copy_ then all-reduce: equivalent to a contiguous clone",
    # conjugate_ops: wrong
    "tp_copy_no_backward_reduce": "f's backward must all-reduce the gradient; this passes it through",
    "tp_copy_inplace_grad": "all-reduces the gradient it is handed in place (text: never writes into it)",
    "tp_copy_mean_grad": "divides the all-reduced gradient by world_size: the table says the sum",
    "tp_copy_noncontiguous_grad": "dy.clone() keeps a transposed gradient non-contiguous: Comm refuses it",
    "tp_reduce_writes_input": "all-reduces x itself (when contiguous) before copying: writes into its input",
    "tp_reduce_backward_all_reduce": "g's backward must be the identity, not an all-reduce (t× gradient, extra call)",
    "tp_reduce_mean": "forward returns the mean over ranks, not the sum",
    "tp_reduce_noncontiguous": "x.clone() of a non-contiguous x stays non-contiguous: all_reduce refuses it",
    "tp_reduce_skips_one_rank": "world_size 1: returns a view of x, no collective (text: new tensor, one collective, "
                                "one rank included)",
    "sp_gather_backward_slices": "backward slices its own gradient: must reduce-scatter (sum over ranks)",
    "sp_gather_backward_all_reduce": "backward all_reduce + slice: right values but the wrong collective, twice the bytes",
    "sp_gather_last_dim": "concatenates along the last dim instead of dim 0",
    "sp_gather_fp32": "gathers in fp32: output dtype fp32 for bf16/fp16 x, and twice the bytes sent",
    "sp_gather_fp32_grad_reduce": "reduce-scatters a half-precision gradient in fp32: twice the bytes in backward",
    "sp_gather_ctx_keeps_output": "a tensor (its output) as a ctx attribute, not save_for_backward: reference cycle "
                                  "keeps the gathered tensor alive",
    "sp_scatter_truncates": "no ValueError for uneven dim 0: drops the remainder rows",
    "sp_scatter_assert": "AssertionError instead of the ValueError the text asks for",
    "sp_scatter_shape_last_dim": "output sized by cutting the last dim: wrong shape (right numbers)",
    "sp_scatter_backward_repeats": "backward tiles its own gradient t times instead of all-gathering every rank's",
    "sp_scatter_backward_all_reduce": "backward all-reduce of zero-padded gradients: right values, wrong collective "
                                      "(twice the bytes)",
    "sp_scatter_reuses_buffer": "keeps its output buffer between calls: a second call overwrites the first output",
    "sp_scatter_grad_strides": "all-gathers the gradient without .contiguous(): text says contiguous tensors only",
    # shard_block
    "shard_block_split_cat": "q, k, v and gate, up split and sliced by the rank's heads/units, cat in order; wo, w2 "
                             "columns; contiguous copies",
    "shard_block_index_select": "explicit index lists with index_select (always a copy)",
    "shard_block_head_views": "head-shaped views, chunk by rank, copy only where still a view of params",
    "shard_block_empty_copy": "torch.empty in params' dtype/device, copy_ of each piece",
    "shard_block_contiguous_rows": "contiguous 1/t of wqkv's rows: rank 0 gets query heads only",
    "shard_block_w13_contiguous_rows": "contiguous 1/t of w13's rows: rank 0 gate rows only",
    "shard_block_wo_rows": "wo sliced by rows: row-parallel wo keeps the rank's columns",
    "shard_block_w2_rows": "w2 sliced by rows: it keeps the columns of the rank's units",
    "shard_block_up_then_gate": "w13 shard stacks up before gate: text says the same order (gate, then up)",
    "shard_block_strided_heads": "round-robin heads: text says rank r takes contiguous heads r·n/t ...",
    "shard_block_megatron_groups": "Megatron's per-group q,k,v interleave: text says q rows, then k, then v "
                                   "(differs with several kv heads per rank)",
    "shard_block_q_heads_for_kv": "k and v take q's head range: wrong with GQA",
    "shard_block_d_model_for_q": "q rows/wo columns sized d_model/t, not q_dim/t: wrong with head_dim_override",
    "shard_block_norm_views": "norms are the params' own tensors: not in their own memory",
    "shard_block_contiguous_view_tp1": ".contiguous() of wo/w2 column slices is a view of params at tp=1",
    "shard_block_transposed_w2": "w2/wo = rows of a contiguous transposed copy, transposed back: not contiguous, "
                                 "and the storage is the whole weight",
    "shard_block_fp32": "torch.empty defaults: fp32 on CPU regardless of params' dtype/device",
    "shard_block_negative_rank": "negative rank accepted (chunk[-1]): text says rank not in 0..tp-1 raises",
    "shard_block_no_kv_check": "no ValueError when tp does not divide n_kv_heads (empty or uneven kv)",
    "shard_block_no_ffn_check": "no ValueError when tp does not divide ffn_hidden",
    "shard_block_tp0_zero_division": "tp=0 raises ZeroDivisionError, not ValueError",
    "shard_block_cached": "caches shards ignoring params: another block's weights get the first block's shard",
    # tp_block
    "tp_block_plain": "the text's pseudo-code, full_block's ops on the rank's heads",
    "tp_block_sublayers": "sublayer helpers; kv repeat by expand+reshape (same order as repeat_interleave)",
    "tp_block_separate_matmuls": "weights split instead of outputs, sdpa enable_gqa: same math, other rounding",
    "tp_block_f_before_norm": "f on the norm's input: plain TP norm weights get only partial gradients; SP norms "
                              "run on the gathered sequence",
    "tp_block_sp_norm_after_gather": "SP: norms run on all tokens after the gather (text: on the rank's rows)",
    "tp_block_no_f": "no f: x's gradient misses the other ranks' contributions (SP: shapes break)",
    "tp_block_no_f_mlp": "no f before the MLP in plain TP: x's and norm2's gradients wrong (backward only)",
    "tp_block_repeat_tiles_kv": "k.repeat tiles kv heads: head i must read kv head i // group (GQA, >1 kv/rank)",
    "tp_block_equal_thirds": "wqkv output cut into equal thirds: wrong with GQA",
    "tp_block_not_causal": "attention without is_causal",
    "tp_block_transpose_reshape": "(b, s, heads, d) reshaped as (s, b, ...): wrong for batch > 1",
    "tp_block_swiglu_swapped": "swiglu(up, gate): silu on the wrong half",
    "tp_block_default_eps": "eps 1e-6 instead of cfg.norm_eps",
    "tp_block_mean_g": "divides g's sum by t",
    "tp_block_rope_on_v": "RoPE applied to v too",
    "tp_block_sp_allreduce_norm_weights": "SP: norm weights through tp_copy: extra all-reduces, summed grads t× too big",
    "tp_block_sp_all_reduce_then_slice": "SP: g as all-reduce + slice: wrong collective/bytes, identity backward "
                                         "gives wrong gradients",
    "tp_block_fp32_residual": "fp32 residual: output fp32 for bf16 x (text: x's dtype)",
    "tp_block_d_model_scale": "attention scaled by 1/sqrt(d_model) instead of 1/sqrt(head_dim)",
    "tp_block_global_rank_rope": "SP: RoPE positions shifted by the rank's row offset after the gather",
    # tp_activation_bytes
    "tp_activation_bytes_table": "the table's rows summed; lse 4 bytes per query and rank's head",
    "tp_activation_bytes_factored": "same count grouped L·(4h+2) + T·(2h+4q+4f)",
    "tp_activation_bytes_terms": "named terms in a dict, summed",
    "tp_activation_bytes_lse_dtype": "lse counted at e bytes, not fp32's 4",
    "tp_activation_bytes_no_lse": "lse row left out",
    "tp_activation_bytes_lse_all_heads": "lse for all n_heads, not n_heads/t",
    "tp_activation_bytes_megatron_inputs": "SP matmul inputs counted as L·h (Megatron), table says T·h",
    "tp_activation_bytes_no_inv_rms": "forgets the norms' 1/rms (2·L elements)",
    "tp_activation_bytes_three_attention": "3·T·q: forgets attention's output",
    "tp_activation_bytes_kv_unrepeated": "k, v at kv heads, not repeated to query heads (GQA only)",
    "tp_activation_bytes_three_ffn": "3·T·f: forgets one of gate/up, silu, product",
    "tp_activation_bytes_full_whole_input": "full recompute keeps T·h under SP, text says L·h",
    "tp_activation_bytes_full_plus_rebuild": "full recompute counted as input + a block's activations (section 7 "
                                             "peak), not what is kept",
    "tp_activation_bytes_L_without_batch": "SP: L = seq/t without batch",
    "tp_activation_bytes_residual_whole": "SP: input and norm2 input counted whole (T·h)",
    "tp_activation_bytes_q_undivided": "q = q_dim, not q_dim/t",
    "tp_activation_bytes_rms_fp32": "1/rms counted at 4 bytes, not e",
    "tp_activation_bytes_q_from_d_model": "q = d_model/t, not q_dim/t (head_dim_override)",
    "tp_activation_bytes_no_recompute_check": "no ValueError for a recompute other than none/full",
    "tp_activation_bytes_no_seq_check": "no ValueError for SP seq not divisible by tp",
    "tp_activation_bytes_no_kv_check": "no ValueError for tp not dividing n_kv_heads",
    "tp_activation_bytes_seq_check_always": "ValueError for seq % tp even without SP",
}
