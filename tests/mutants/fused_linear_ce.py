"""Known-wrong (and known-right alternative) implementations of lesson 06's exercises."""
import memfit.from_lessons.fused_linear_ce as ref  # first: memfit selects Triton's interpreter before triton loads
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from memfit.hardware import config


# ------------------------------------------------------------------- exercise 1: loss and dlogits
def _ce(logits, targets, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
        divide_by_all=False, onehot=True, smoothing_in_grad=True, softcap_chain=True, guard_empty=True):
    z = logits.float()
    if softcap is not None:
        capped = torch.tanh(z / softcap)
        z = softcap * capped
    keep = targets != ignore_index
    count = targets.numel() if divide_by_all else int(keep.sum())
    if reduction != "mean":
        scale = 1.0
    else:  # unguarded: a tensor 1 / 0 = inf, and 0 * inf = NaN
        scale = 1.0 / max(count, 1) if guard_empty else 1.0 / keep.sum()
    lse = torch.logsumexp(z, dim=1)
    safe = torch.where(keep, targets, 0)
    z_t = z.gather(1, safe[:, None]).squeeze(1)
    eps = label_smoothing
    loss = torch.where(keep, (1 - eps) * (lse - z_t) + eps * (lse - z.mean(dim=1)), 0.0).sum() * scale
    g_eps = eps if smoothing_in_grad else 0.0
    grad = torch.softmax(z, dim=1) - g_eps / z.shape[1]
    if onehot:
        grad.scatter_add_(1, safe[:, None], torch.full_like(z_t[:, None], -(1 - g_eps)))
    if softcap is not None and softcap_chain:
        grad *= 1 - capped * capped
    grad *= torch.where(keep, scale, 0.0)[:, None] if guard_empty else (keep * scale)[:, None]
    return loss, grad.to(logits.dtype)


def ce_mean_over_all_tokens(logits, targets, *args, **kwargs):  # divides by N, ignored tokens included
    return _ce(logits, targets, *args, divide_by_all=True, **kwargs)


def ce_grad_is_softmax(logits, targets, *args, **kwargs):  # forgets the one-hot: dlogits = softmax
    return _ce(logits, targets, *args, onehot=False, **kwargs)


def ce_smoothing_only_in_loss(logits, targets, *args, **kwargs):  # smooths the loss, not the gradient
    return _ce(logits, targets, *args, smoothing_in_grad=False, **kwargs)


def ce_softcap_without_chain_rule(logits, targets, *args, **kwargs):  # misses the factor 1 - tanh^2
    return _ce(logits, targets, *args, softcap_chain=False, **kwargs)


def ce_nan_when_all_ignored(logits, targets, *args, **kwargs):  # 0 / 0 when every token is ignored
    return _ce(logits, targets, *args, guard_empty=False, **kwargs)


def ce_by_autograd(logits, targets, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None):
    """Right: F.cross_entropy differentiated by autograd on a detached fp32 copy (all-ignored handled)."""
    with torch.enable_grad():
        z = logits.detach().float().requires_grad_(True)
        capped = softcap * torch.tanh(z / softcap) if softcap is not None else z
        if (targets == ignore_index).all():
            loss = capped.sum() * 0
        else:
            loss = F.cross_entropy(capped, targets, ignore_index=ignore_index, reduction=reduction,
                                   label_smoothing=label_smoothing)
        loss.backward()
    return loss.detach(), z.grad.to(logits.dtype)


# ------------------------------------------------------------------------ exercise 2: chunks of tokens
def _chunked(x, weight, targets, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
             softcap=None, chunk_size=None, per_chunk_mean=False, whole=False, floor_chunks=False):
    n, h = x.shape
    chunk = n if whole else (chunk_size or ref.liger_chunk_size(n, h, weight.shape[0]))
    n_valid = int((targets != ignore_index).sum())
    dx, dw = torch.empty_like(x), torch.zeros_like(weight)
    db = None if bias is None else torch.zeros_like(bias)
    loss = torch.zeros((), device=x.device)
    stop = n // chunk * chunk if floor_chunks else n
    for start in range(0, stop, chunk):
        xc, tc = x[start:start + chunk], targets[start:start + chunk]
        count = int((tc != ignore_index).sum()) if per_chunk_mean else n_valid
        scale = 1.0 / max(count, 1) if reduction == "mean" else 1.0
        part, dlogits = ref.cross_entropy_with_grad(F.linear(xc, weight, bias), tc, ignore_index, "sum",
                                                    label_smoothing, softcap)
        dlogits *= scale
        loss += part * scale
        torch.mm(dlogits, weight, out=dx[start:start + chunk])
        dw.addmm_(dlogits.t(), xc)
        if db is not None:
            db += dlogits.sum(dim=0)
    return loss, dx, dw, db


def chunked_mean_per_chunk(*args, **kwargs):  # each chunk divides by its own count of tokens
    return _chunked(*args, per_chunk_mean=True, **kwargs)


def chunked_all_logits_at_once(*args, **kwargs):  # right numbers, but one "chunk" of all N x V logits
    return _chunked(*args, whole=True, **kwargs)


def chunked_drops_last_partial_chunk(*args, **kwargs):  # range(0, n // chunk * chunk): the tail never computed
    return _chunked(*args, floor_chunks=True, **kwargs)


def chunked_in_sevens(x, weight, targets, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                      softcap=None, chunk_size=None):  # right: another chunk size, not a power of two
    return _chunked(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size=7)


# ------------------------------------------------------------- exercise 3: the Triton kernels, in tiles
@triton.jit
def _grad_kernel_local_target(logits_ptr, stride, targets_ptr, lse_ptr, col0, n_cols, vocab, ignore_index, scale,
                              smoothing, softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """ce_grad_kernel comparing the tile's column with the target without the tile's offset col0."""
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    target = tl.load(targets_ptr + row)
    lse = tl.load(lse_ptr + row)
    row_scale = tl.where(target != ignore_index, scale, 0.0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        z = ref.softcapped(tl.load(base + cols, mask=inside, other=0.0).to(tl.float32), softcap, SOFTCAP)
        grad = tl.exp(z - lse) - smoothing / vocab - tl.where(cols == target, 1 - smoothing, 0.0)
        if SOFTCAP:
            capped = z / softcap
            grad = grad * (1 - capped * capped)
        tl.store(base + cols, (grad * row_scale).to(logits_ptr.dtype.element_ty), mask=inside)


def _tiles(x, weight, targets, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
           fp32_dw=False, chunks=None, tile_lse=False, dw_overwrites=False, grad_kernel=None, torch_softmax=False,
           chunk_mean=False):
    """A compact variant of the reference's loop (always two passes) with one mistake switched on."""
    ref.check_linear_ce_inputs(x, weight, targets, bias, reduction, label_smoothing, softcap)
    n, h = x.shape
    vocab = weight.shape[0]
    tokens, columns = chunks or ref.chunk_plan(n, h, vocab, x.element_size())
    keep = targets != ignore_index
    fp32 = dict(dtype=torch.float32, device=x.device)
    dx, dw = torch.empty_like(x), torch.empty_like(weight)
    db = None if bias is None else torch.zeros(vocab, **fp32)
    loss = torch.zeros((), **fp32)
    launch = dict(softcap=softcap or 1.0, SOFTCAP=softcap is not None, **config("ce_rows"))
    for t0 in range(0, n, tokens):
        t1 = min(t0 + tokens, n)
        xc, tc = x[t0:t1], targets[t0:t1]
        count = int(keep[t0:t1].sum()) if chunk_mean else int(keep.sum())
        scale = 1.0 / max(count, 1) if reduction == "mean" else 1.0
        rows = t1 - t0
        m = torch.full((rows,), float("-inf"), **fp32)
        l, total, z_t = torch.zeros(rows, **fp32), torch.zeros(rows, **fp32), torch.zeros(rows, **fp32)
        stats = (tc, m, l, z_t, total)
        if not tile_lse:
            for v0 in range(0, vocab, columns):
                z = F.linear(xc, weight[v0:v0 + columns], None if bias is None else bias[v0:v0 + columns])
                ref.ce_stats_kernel[(rows,)](z, z.stride(0), *stats, v0, z.shape[1], **launch)
        acc = torch.zeros(rows, h, **fp32)
        for v0 in range(0, vocab, columns):
            v1 = min(v0 + columns, vocab)
            z = F.linear(xc, weight[v0:v1], None if bias is None else bias[v0:v1])
            if torch_softmax:
                z = ref.cross_entropy_with_grad(F.linear(xc, weight, bias), tc, ignore_index, "sum", label_smoothing,
                                                softcap)[1][:, v0:v1] * scale
            else:
                if tile_lse:  # the statistics of this tile only: lse of a part of the row
                    m.fill_(float("-inf")), l.zero_()
                    ref.ce_stats_kernel[(rows,)](z, z.stride(0), *stats, v0, z.shape[1], **launch)
                lse = m + torch.log(l)
                (grad_kernel or ref.ce_grad_kernel)[(rows,)](z, z.stride(0), tc, lse, v0, v1 - v0, vocab,
                                                             ignore_index, scale, label_smoothing, **launch)
            if t0 == 0 or dw_overwrites:
                torch.mm(z.t(), xc, out=dw[v0:v1])
            else:
                dw[v0:v1].addmm_(z.t(), xc)
            if db is not None:
                db[v0:v1] += z.sum(dim=0, dtype=torch.float32)
            acc += torch.mm(z, weight[v0:v1])
        dx[t0:t1] = acc
        lse = m + torch.log(l)
        eps = label_smoothing
        loss += torch.where(keep[t0:t1], (1 - eps) * (lse - z_t) + eps * (lse - total / vocab), 0.0).sum() * scale
    return loss, dx, dw, None if db is None else db.to(bias.dtype)


def tiles_lse_of_each_tile(*args, **kwargs):  # no first pass: each tile normalised by its own logsumexp
    return _tiles(*args, tile_lse=True, **kwargs)


def tiles_dw_overwritten_per_chunk(*args, **kwargs):  # dW = the last chunk's product instead of the sum
    return _tiles(*args, dw_overwrites=True, **kwargs)


def tiles_target_without_offset(*args, **kwargs):  # the one-hot lands in every tile at the target's local index
    return _tiles(*args, grad_kernel=_grad_kernel_local_target, **kwargs)


def tiles_mean_per_chunk(*args, **kwargs):  # each chunk of tokens divided by its own count
    return _tiles(*args, chunk_mean=True, **kwargs)


def tiles_with_torch_softmax(*args, **kwargs):  # right numbers, but PyTorch's softmax over whole rows
    return _tiles(*args, torch_softmax=True, **kwargs)


def tiles_other_chunks(x, weight, targets, *args, chunks=None, **kwargs):  # right: smaller tiles, always 2 passes
    return _tiles(x, weight, targets, *args, chunks=(32, 200), **kwargs)


@torch.no_grad()
def tiles_full_grid_last_chunk(x, weight, targets, bias=None, ignore_index=-100, reduction="mean",
                               label_smoothing=0.0, softcap=None, fp32_dw=False, chunks=None):
    """Right numbers in rows it owns, but every chunk launches a full grid of C programs: on a partial last chunk
    the extra programs write past the end of the per-token statistics (m, l, ...)."""
    n, h = x.shape
    vocab = weight.shape[0]
    tokens, columns = chunks or ref.chunk_plan(n, h, vocab, x.element_size())
    keep = targets != ignore_index
    scale = 1.0 / max(int(keep.sum()), 1) if reduction == "mean" else 1.0
    fp32 = dict(dtype=torch.float32, device=x.device)
    dx, dw = torch.empty_like(x), torch.zeros(weight.shape, **fp32)
    db = None if bias is None else torch.zeros(vocab, **fp32)
    m = torch.full((n,), float("-inf"), **fp32)
    l, total, z_t = torch.zeros(n, **fp32), torch.zeros(n, **fp32), torch.zeros(n, **fp32)
    tile = torch.empty(tokens * columns, dtype=x.dtype, device=x.device)  # room for the extra rows' stores
    launch = dict(softcap=softcap or 1.0, SOFTCAP=softcap is not None, **config("ce_rows"))
    for t0 in range(0, n, tokens):
        t1 = min(t0 + tokens, n)
        xc, tc = x[t0:t1], targets[t0:t1]
        acc = torch.zeros(t1 - t0, h, **fp32)
        for second_pass in (False, True):
            for v0 in range(0, vocab, columns):
                v1 = min(v0 + columns, vocab)
                z = tile[:(t1 - t0) * (v1 - v0)].view(t1 - t0, v1 - v0)
                torch.mm(xc, weight[v0:v1].t(), out=z) if bias is None else torch.addmm(bias[v0:v1], xc,
                                                                                       weight[v0:v1].t(), out=z)
                if not second_pass:
                    ref.ce_stats_kernel[(tokens,)](z, z.stride(0), tc, m[t0:t1], l[t0:t1], z_t[t0:t1],
                                                   total[t0:t1], v0, v1 - v0, **launch)
                    continue
                ref.ce_grad_kernel[(tokens,)](z, z.stride(0), tc, m[t0:t1] + torch.log(l[t0:t1]), v0, v1 - v0,
                                              vocab, ignore_index, scale, label_smoothing, **launch)
                dw[v0:v1] += z.t().float() @ xc.float()
                acc += z.float() @ weight[v0:v1].float()
                if db is not None:
                    db[v0:v1] += z.sum(0, dtype=torch.float32)
        dx[t0:t1] = acc
    lse = m + torch.log(l)
    eps = label_smoothing
    loss = torch.where(keep, (1 - eps) * (lse - z_t) + eps * (lse - total / vocab), 0.0).sum() * scale
    return loss, dx, dw.to(weight.dtype), None if db is None else db.to(bias.dtype)


# ------------------------------------------------------------------- exercise 4: the autograd Function
class _Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, bias, ignore_index, reduction, smoothing, softcap, mode):
        loss, dx, dw, db = ref.fused_linear_ce_forward(x, weight, targets, bias, ignore_index, reduction, smoothing,
                                                       softcap)
        ctx.save_for_backward(dx, dw, *([] if db is None else [db]))
        ctx.mode = mode
        return loss

    @staticmethod
    def backward(ctx, g):
        grads = list(ctx.saved_tensors)
        if ctx.mode == "copy":
            grads = [t * g for t in grads]
        elif ctx.mode == "in place":
            for t in grads:
                t.mul_(g)
        dx, dw, db = grads + [None] * (3 - len(grads))
        return dx, dw, None, db, None, None, None, None, None


def _function(mode):
    def fused(x, weight, targets, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None,
              fp32_dw=False):
        return _Scaled.apply(x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1), bias, ignore_index, reduction,
                             label_smoothing, softcap, mode)
    return fused


function_copies_in_backward = _function("copy")  # dx * g, dw * g: a second dW during backward
function_ignores_grad_output = _function("ignore")  # returns the saved gradients unscaled
function_always_in_place = _function("in place")  # right: scales in place even when g is 1
