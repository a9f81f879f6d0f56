"""Blind set for lesson 06_fused_linear_ce: written from the exercise text alone (lessons/06_fused_linear_ce.ipynb)."""
import memfit  # noqa: F401  (before triton: selects Triton's interpreter without a GPU)
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from memfit.from_lessons.fused_linear_ce import (IGNORE_INDEX, check_linear_ce_inputs, chunk_plan,
                                                 liger_chunk_size, softcapped)


# ======================================================================================================
# Exercise 1: cross_entropy_with_grad -- one parameterised core, each public function one mistake
# ======================================================================================================

def _ce_core(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean", label_smoothing=0.0, softcap=None,
             *, bug=None):
    n, vocab = logits.shape
    eps = float(label_smoothing)
    z = logits.float()
    th = None
    if softcap is not None:
        th = torch.tanh(z / softcap)
        z = softcap * th
    if bug == "hardcoded_ignore":
        valid = targets != -100
    else:
        valid = targets != ignore_index
    n_valid = int(valid.sum())
    safe_t = torch.where(valid, targets, torch.zeros_like(targets))
    if bug == "no_max_shift":
        e = torch.exp(z)
        s = e.sum(-1, keepdim=True)
        lse = s.log().squeeze(-1)
    else:
        m = z.amax(-1, keepdim=True)
        e = torch.exp(z - m)
        s = e.sum(-1, keepdim=True)
        lse = (m + s.log()).squeeze(-1)
    zt = z.gather(1, safe_t[:, None]).squeeze(1)
    nll = torch.where(valid, lse - zt, torch.zeros_like(lse))
    smooth = lse - z.mean(-1)
    if bug != "smoothing_unmasked":
        smooth = torch.where(valid, smooth, torch.zeros_like(smooth))
    rows = (1 - eps) * nll + eps * smooth
    if reduction == "mean" or bug == "always_mean":
        if bug == "mean_over_all_tokens":
            denom = n
        elif bug == "all_ignored_nan":
            denom = n_valid
        else:
            denom = n_valid if n_valid > 0 else None
        scale = (1.0 / denom if denom else (float("nan") if bug == "all_ignored_nan" else 0.0))
    else:
        scale = 1.0
    loss = rows.sum() * scale if n_valid > 0 or bug == "all_ignored_nan" else rows.sum() * 0.0
    # the gradient: softmax - eps/V - (1 - eps) one-hot, times the softcap's derivative
    grad = e / s
    grad -= eps / vocab
    hot = 1.0 if bug == "smoothing_grad_full_onehot" else (1.0 - eps)
    grad.scatter_add_(1, safe_t[:, None], torch.full((n, 1), -hot, dtype=grad.dtype, device=grad.device))
    if th is not None and bug != "softcap_no_derivative":
        grad *= 1 - th * th
    if bug == "ignored_rows_keep_grad":
        grad *= scale
    else:
        grad *= torch.where(valid, scale, 0.0).to(grad.dtype)[:, None]
    out_dtype = torch.float32 if bug == "fp32_dlogits" else logits.dtype
    return loss.float().reshape(()), grad.to(out_dtype)


def cross_entropy_with_grad_ref_like(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                     label_smoothing=0.0, softcap=None):
    """My own correct version (used by the later exercises' mutants)."""
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap)


def cross_entropy_with_grad_no_max_shift(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                         label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap, bug="no_max_shift")


def cross_entropy_with_grad_all_ignored_nan(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                            label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap, bug="all_ignored_nan")


def cross_entropy_with_grad_mean_over_all_tokens(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                                 label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap,
                    bug="mean_over_all_tokens")


def cross_entropy_with_grad_ignored_rows_keep_grad(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                                   label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap,
                    bug="ignored_rows_keep_grad")


def cross_entropy_with_grad_smoothing_full_onehot(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                                  label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap,
                    bug="smoothing_grad_full_onehot")


def cross_entropy_with_grad_smoothing_unmasked(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                               label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap, bug="smoothing_unmasked")


def cross_entropy_with_grad_softcap_no_derivative(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                                  label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap,
                    bug="softcap_no_derivative")


def cross_entropy_with_grad_fp32_dlogits(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                         label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap, bug="fp32_dlogits")


def cross_entropy_with_grad_always_mean(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                        label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap, bug="always_mean")


def cross_entropy_with_grad_hardcoded_ignore(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                             label_smoothing=0.0, softcap=None):
    return _ce_core(logits, targets, ignore_index, reduction, label_smoothing, softcap, bug="hardcoded_ignore")


def cross_entropy_with_grad_log_softmax(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean",
                                        label_smoothing=0.0, softcap=None):
    """RIGHT: PyTorch's log_softmax (exercise 1 is plain PyTorch), a one-hot by F.one_hot, explicit masks."""
    z = logits.float()
    d = None
    if softcap is not None:
        t = torch.tanh(z / softcap)
        d = 1 - t * t
        z = softcap * t
    vocab = z.shape[-1]
    logp = torch.log_softmax(z, dim=-1)
    valid = targets != ignore_index
    count = valid.sum().to(torch.float32)
    tgt = targets.masked_fill(~valid, 0)
    nll = -logp.gather(1, tgt[:, None]).squeeze(1)
    smooth = -logp.mean(dim=-1)
    per_row = ((1 - label_smoothing) * nll + label_smoothing * smooth) * valid
    if reduction == "mean":
        w = torch.where(count > 0, 1.0 / count.clamp_min(1), torch.zeros_like(count))
    else:
        w = torch.ones_like(count)
    loss = per_row.sum() * w
    target_dist = F.one_hot(tgt, vocab).to(torch.float32) * (1 - label_smoothing) + label_smoothing / vocab
    grad = logp.exp() - target_dist
    if d is not None:
        grad = grad * d
    grad = grad * (valid.to(torch.float32) * w)[:, None]
    return loss.to(torch.float32), grad.to(logits.dtype)


# ======================================================================================================
# Exercise 2: chunked_linear_ce
# ======================================================================================================

def _chunked_core(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean", label_smoothing=0.0,
                  softcap=None, chunk_size=None, *, bug=None, reverse=False):
    n, h = x.shape
    vocab = weight.shape[0]
    if chunk_size is None:
        chunk_size = n if bug == "default_one_chunk" else liger_chunk_size(n, h, vocab)
    n_valid = int((targets != ignore_index).sum())
    if reduction == "mean" or bug == "sum_scaled_as_mean":
        scale = 1.0 / n_valid if n_valid > 0 else 0.0
    else:
        scale = 1.0
    dx = torch.empty(n, h, dtype=x.dtype, device=x.device)
    if bug == "drops_tail":
        dx.zero_()
    dw = torch.zeros_like(weight)
    db32 = None if bias is None else torch.zeros(vocab, dtype=torch.float32, device=x.device)
    loss = torch.zeros((), dtype=torch.float32, device=x.device)
    full = F.linear(x, weight, bias) if bug == "full_logits" else None
    if bug == "drops_tail":
        starts = list(range(0, (n // chunk_size) * chunk_size, chunk_size))
    else:
        starts = list(range(0, n, chunk_size))
    if reverse:
        starts = starts[::-1]
    chunk_means = []
    for s in starts:
        e = min(s + chunk_size, n)
        xc, tc = x[s:e], targets[s:e]
        if full is not None:
            logits = full[s:e]
        elif bug == "no_bias_in_logits":
            logits = F.linear(xc, weight)
        else:
            logits = F.linear(xc, weight, bias)
        if bug == "mean_per_chunk" and reduction == "mean":
            lc, g = cross_entropy_with_grad_ref_like(logits, tc, ignore_index, "mean", label_smoothing, softcap)
            chunk_means.append(lc)
            g = g / len(starts)
        else:
            lc, g = cross_entropy_with_grad_ref_like(logits, tc, ignore_index, "sum", label_smoothing, softcap)
            loss += lc
            if scale != 1.0:
                g = g * scale
        del logits
        dx[s:e] = g @ weight
        dw.addmm_(g.t(), xc)
        if db32 is not None:
            db32 += g.sum(0, dtype=torch.float32)
    if bug == "mean_per_chunk" and reduction == "mean":
        loss = torch.stack(chunk_means).mean()
    else:
        loss = loss * scale
    db = None if db32 is None else db32.to(bias.dtype)
    return loss, dx, dw, db


def chunked_linear_ce_mean_per_chunk(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                     label_smoothing=0.0, softcap=None, chunk_size=None):
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         bug="mean_per_chunk")


def chunked_linear_ce_drops_tail(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                 label_smoothing=0.0, softcap=None, chunk_size=None):
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         bug="drops_tail")


def chunked_linear_ce_no_bias_in_logits(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                        reduction="mean", label_smoothing=0.0, softcap=None, chunk_size=None):
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         bug="no_bias_in_logits")


def chunked_linear_ce_full_logits(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                  label_smoothing=0.0, softcap=None, chunk_size=None):
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         bug="full_logits")


def chunked_linear_ce_default_one_chunk(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                        reduction="mean", label_smoothing=0.0, softcap=None, chunk_size=None):
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         bug="default_one_chunk")


def chunked_linear_ce_sum_scaled_as_mean(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                         reduction="mean", label_smoothing=0.0, softcap=None, chunk_size=None):
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         bug="sum_scaled_as_mean")


def chunked_linear_ce_reverse_order(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                    label_smoothing=0.0, softcap=None, chunk_size=None):
    """RIGHT: the chunks in reverse order (dW's sum commutes), each chunk's rows of dX written directly."""
    return _chunked_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
                         reverse=True)


# ======================================================================================================
# Exercise 3: kernels and fused_linear_ce_forward
# ======================================================================================================

@triton.jit
def _stats_ok(logits_ptr, stride, targets_ptr, m_ptr, l_ptr, target_logit_ptr, sum_ptr, col0, n_cols,
              softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    m = tl.load(m_ptr + row)
    l = tl.load(l_ptr + row)
    s = tl.load(sum_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        z = softcapped(z, softcap, SOFTCAP)
        z = tl.where(mask, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        s += tl.sum(tl.where(mask, z, 0.0), 0)
        m = m_new
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, l)
    tl.store(sum_ptr + row, s)
    local = t - col0
    if (local >= 0) & (local < n_cols):
        zt = tl.load(row_ptr + local).to(tl.float32)
        zt = softcapped(zt, softcap, SOFTCAP)
        tl.store(target_logit_ptr + row, zt)


@triton.jit
def _stats_no_rescale(logits_ptr, stride, targets_ptr, m_ptr, l_ptr, target_logit_ptr, sum_ptr, col0, n_cols,
                      softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    # the tile's own online softmax is right, but it is merged into the running (m, l) of the earlier tiles
    # without rescaling the earlier sum to the new max
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    m_prev = tl.load(m_ptr + row)
    l_prev = tl.load(l_ptr + row)
    s = tl.load(sum_ptr + row)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        z = softcapped(z, softcap, SOFTCAP)
        z = tl.where(mask, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        s += tl.sum(tl.where(mask, z, 0.0), 0)
        m = m_new
    m_all = tl.maximum(m_prev, m)
    l_all = l_prev + l * tl.exp(m - m_all)
    tl.store(m_ptr + row, m_all)
    tl.store(l_ptr + row, l_all)
    tl.store(sum_ptr + row, s)
    local = t - col0
    if (local >= 0) & (local < n_cols):
        zt = tl.load(row_ptr + local).to(tl.float32)
        zt = softcapped(zt, softcap, SOFTCAP)
        tl.store(target_logit_ptr + row, zt)


@triton.jit
def _stats_softcap_pad(logits_ptr, stride, targets_ptr, m_ptr, l_ptr, target_logit_ptr, sum_ptr, col0, n_cols,
                       softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    # masked lanes loaded as -inf, then softcapped: they become -softcap, not -inf, and join the sum
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    m = tl.load(m_ptr + row)
    l = tl.load(l_ptr + row)
    s = tl.load(sum_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
        z = softcapped(z, softcap, SOFTCAP)
        m_new = tl.maximum(m, tl.max(z, 0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        s += tl.sum(tl.where(mask, z, 0.0), 0)
        m = m_new
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, l)
    tl.store(sum_ptr + row, s)
    local = t - col0
    if (local >= 0) & (local < n_cols):
        zt = tl.load(row_ptr + local).to(tl.float32)
        zt = softcapped(zt, softcap, SOFTCAP)
        tl.store(target_logit_ptr + row, zt)


@triton.jit
def _stats_target_uncapped(logits_ptr, stride, targets_ptr, m_ptr, l_ptr, target_logit_ptr, sum_ptr, col0, n_cols,
                           softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    # the target's logit is stored raw: the softcap is applied to the softmax but not to z_t
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    m = tl.load(m_ptr + row)
    l = tl.load(l_ptr + row)
    s = tl.load(sum_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        z = softcapped(z, softcap, SOFTCAP)
        z = tl.where(mask, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        s += tl.sum(tl.where(mask, z, 0.0), 0)
        m = m_new
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, l)
    tl.store(sum_ptr + row, s)
    local = t - col0
    if (local >= 0) & (local < n_cols):
        zt = tl.load(row_ptr + local).to(tl.float32)
        tl.store(target_logit_ptr + row, zt)


@triton.jit
def _stats_sum_not_carried(logits_ptr, stride, targets_ptr, m_ptr, l_ptr, target_logit_ptr, sum_ptr, col0, n_cols,
                           softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    # the row's sum of logits (label smoothing) restarts at 0 in each tile: only the last tile's sum survives
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    m = tl.load(m_ptr + row)
    l = tl.load(l_ptr + row)
    s = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        z = softcapped(z, softcap, SOFTCAP)
        z = tl.where(mask, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        s += tl.sum(tl.where(mask, z, 0.0), 0)
        m = m_new
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, l)
    tl.store(sum_ptr + row, s)
    local = t - col0
    if (local >= 0) & (local < n_cols):
        zt = tl.load(row_ptr + local).to(tl.float32)
        zt = softcapped(zt, softcap, SOFTCAP)
        tl.store(target_logit_ptr + row, zt)


@triton.jit
def _grad_ok(logits_ptr, stride, targets_ptr, lse_ptr, col0, n_cols, vocab, ignore_index, scale,
             smoothing, softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    lse = tl.load(lse_ptr + row)
    w = tl.where(t == ignore_index, 0.0, scale)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        zc = softcapped(z, softcap, SOFTCAP)
        g = tl.exp(zc - lse) - smoothing / vocab - tl.where(cols + col0 == t, 1.0 - smoothing, 0.0)
        if SOFTCAP:
            u = zc / softcap
            g = g * (1.0 - u * u)
        g = g * w
        tl.store(row_ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grad_local_onehot(logits_ptr, stride, targets_ptr, lse_ptr, col0, n_cols, vocab, ignore_index, scale,
                       smoothing, softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    # the one-hot compares the tile's local column with the target: the tile offset col0 is forgotten
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    lse = tl.load(lse_ptr + row)
    w = tl.where(t == ignore_index, 0.0, scale)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        zc = softcapped(z, softcap, SOFTCAP)
        g = tl.exp(zc - lse) - smoothing / vocab - tl.where(cols == t, 1.0 - smoothing, 0.0)
        if SOFTCAP:
            u = zc / softcap
            g = g * (1.0 - u * u)
        g = g * w
        tl.store(row_ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grad_no_ignore(logits_ptr, stride, targets_ptr, lse_ptr, col0, n_cols, vocab, ignore_index, scale,
                    smoothing, softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    # ignored tokens get softmax * scale (their one-hot never matches): no zeros for them
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(targets_ptr + row)
    lse = tl.load(lse_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        zc = softcapped(z, softcap, SOFTCAP)
        g = tl.exp(zc - lse) - smoothing / vocab - tl.where(cols + col0 == t, 1.0 - smoothing, 0.0)
        if SOFTCAP:
            u = zc / softcap
            g = g * (1.0 - u * u)
        g = g * scale
        tl.store(row_ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)


_SCRATCH = {}


def _dw_update(dw, c0, g, xc, step):
    """dw[c0:c0+cols] += gᵀ xc, in place; in column blocks when dw is an fp32 buffer of low-precision inputs."""
    cols = g.shape[1]
    if dw.dtype == g.dtype:
        dw[c0:c0 + cols].addmm_(g.t(), xc)
    else:
        for j in range(0, cols, step):
            k = min(j + step, cols)
            dw[c0 + j:c0 + k] += (g[:, j:k].t() @ xc).float()


def _fused_core(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean", label_smoothing=0.0,
                softcap=None, fp32_dw=False, chunks=None, *, stats=_stats_ok, grad=_grad_ok, max_block=2048,
                bug=None, always_two_pass=False):
    check_linear_ce_inputs(x, weight, targets, bias, reduction, label_smoothing, softcap)
    n, h = x.shape
    vocab = weight.shape[0]
    dev = x.device
    if chunks is None:
        chunks = (n, vocab) if bug == "default_full" else chunk_plan(n, h, vocab, x.element_size())
    c_tok, c_voc = chunks
    c_voc = min(c_voc, vocab)
    targets = targets.contiguous()
    valid = targets != ignore_index
    n_valid = int(valid.sum())
    if reduction == "mean":
        scale = 1.0 / n_valid if n_valid > 0 else 0.0
    else:
        scale = 1.0
    use_sc = softcap is not None
    sc = float(softcap) if use_sc else 1.0
    dx = torch.empty(n, h, dtype=x.dtype, device=dev)
    acc32 = fp32_dw or bug == "always_fp32_dw"
    dw = torch.zeros(vocab, h, dtype=torch.float32 if acc32 else weight.dtype, device=dev)
    db32 = None if bias is None else torch.zeros(vocab, dtype=torch.float32, device=dev)
    loss = torch.zeros((), dtype=torch.float32, device=dev)

    scratch = []  # one tile buffer, reused by every tile of every chunk

    def tile_logits(xc, c0, c1, with_bias=True):
        b = bias[c0:c1] if (bias is not None and with_bias) else None
        rows, cols = xc.shape[0], c1 - c0
        if bug == "keeps_tiles":
            return F.linear(xc, weight[c0:c1], b)
        numel = min(c_tok, n) * c_voc
        if bug == "cached_scratch":
            key = (numel, x.dtype, str(dev))
            if key not in _SCRATCH:
                _SCRATCH[key] = torch.empty(numel, dtype=x.dtype, device=dev)
            flat = _SCRATCH[key]
        else:
            if not scratch:
                scratch.append(torch.empty(numel, dtype=x.dtype, device=dev))
            flat = scratch[0]
        out = flat[:rows * cols].view(rows, cols)
        if b is None:
            torch.mm(xc, weight[c0:c1].t(), out=out)
        else:
            torch.addmm(b, xc, weight[c0:c1].t(), out=out)
        return out

    def block(cols):
        return min(max_block, triton.next_power_of_2(cols))

    for s in range(0, n, c_tok):
        e = min(s + c_tok, n)
        rows = e - s
        xc, tc = x[s:e], targets[s:e]
        if bug == "mean_per_chunk" and reduction == "mean":
            nv = int((tc != ignore_index).sum())
            scale = rows / (n * nv) if nv > 0 else 0.0
        m = torch.full((rows,), float("-inf"), dtype=torch.float32, device=dev)
        l = torch.zeros(rows, dtype=torch.float32, device=dev)
        zt = torch.zeros(rows, dtype=torch.float32, device=dev)
        zsum = torch.zeros(rows, dtype=torch.float32, device=dev)
        whole = c_voc >= vocab and not always_two_pass
        kept = []
        for c0 in range(0, vocab, c_voc):
            c1 = min(c0 + c_voc, vocab)
            logits = tile_logits(xc, c0, c1)
            if bug == "torch_stats":
                zz = logits.float()
                if use_sc:
                    zz = sc * torch.tanh(zz / sc)
                lse_t = torch.logsumexp(zz, dim=-1)
                m_new = torch.maximum(m, lse_t)
                l = l * torch.exp(m - m_new) + torch.exp(lse_t - m_new)
                m = m_new
                zsum += zz.sum(-1)
                local = tc - c0
                inside = (local >= 0) & (local < c1 - c0)
                got = zz.gather(1, local.clamp(0, c1 - c0 - 1)[:, None]).squeeze(1)
                zt = torch.where(inside, got, zt)
                del zz
            else:
                stats[(rows,)](logits, logits.stride(0), tc, m, l, zt, zsum, c0, c1 - c0, sc,
                               SOFTCAP=use_sc, BLOCK=block(c1 - c0))
            if whole or bug == "keeps_tiles":
                kept.append(logits)
            del logits
        lse = m + torch.log(l)
        dx_acc = None if whole else torch.zeros(rows, h, dtype=torch.float32, device=dev)
        for i, c0 in enumerate(range(0, vocab, c_voc)):
            c1 = min(c0 + c_voc, vocab)
            if kept:
                g = kept[i]
            else:
                g = tile_logits(xc, c0, c1, with_bias=(bug != "no_bias_in_recompute"))
            if bug == "torch_grad":
                zz = g.float()
                if use_sc:
                    u = torch.tanh(zz / sc)
                    zz = sc * u
                p = torch.exp(zz - lse[:, None]) - label_smoothing / vocab
                local = tc - c0
                inside = (local >= 0) & (local < c1 - c0)
                p.scatter_add_(1, local.clamp(0, c1 - c0 - 1)[:, None],
                               torch.where(inside, -(1.0 - label_smoothing), 0.0)[:, None].to(p.dtype))
                if use_sc:
                    p *= 1 - u * u
                p *= torch.where(tc == ignore_index, 0.0, scale)[:, None]
                g.copy_(p)
                del zz, p
            else:
                grad[(rows,)](g, g.stride(0), tc, lse, c0, c1 - c0, vocab, ignore_index, scale,
                              float(label_smoothing), sc, SOFTCAP=use_sc, BLOCK=block(c1 - c0))
            if whole:
                dx[s:e] = g @ weight
            else:
                if g.dtype == torch.float32:
                    dx_acc.addmm_(g, weight[c0:c1])
                else:
                    dx_acc += (g @ weight[c0:c1]).float()
            _dw_update(dw, c0, g, xc, max(256, rows))
            if db32 is not None:
                db32[c0:c1] += g.sum(0, dtype=torch.float32)
            del g
        kept.clear()
        if dx_acc is not None:
            dx[s:e] = dx_acc
            del dx_acc
        eps = float(label_smoothing)
        row_loss = (1 - eps) * (lse - zt) + eps * (lse - zsum / vocab)
        row_valid = tc != ignore_index
        row_loss = torch.where(row_valid, row_loss, torch.zeros_like(row_loss))
        loss += row_loss.sum() * scale
    if acc32 and not (bug == "fp32_dw_dtype" and fp32_dw):
        dw = dw.to(weight.dtype)
    db = None if db32 is None else db32.to(bias.dtype)
    return loss, dx, dw, db


@torch.no_grad()
def fused_linear_ce_forward_ref_like(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                     label_smoothing=0.0, softcap=None, fp32_dw=False, chunks=None):
    """My own correct version (used by exercise 4's mutants)."""
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks)


@torch.no_grad()
def fused_linear_ce_forward_no_rescale_across_tiles(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                                    reduction="mean", label_smoothing=0.0, softcap=None,
                                                    fp32_dw=False, chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       stats=_stats_no_rescale)


@torch.no_grad()
def fused_linear_ce_forward_softcap_pad_lanes(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                              reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                              chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       stats=_stats_softcap_pad)


@torch.no_grad()
def fused_linear_ce_forward_target_logit_uncapped(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                                  reduction="mean", label_smoothing=0.0, softcap=None,
                                                  fp32_dw=False, chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       stats=_stats_target_uncapped)


@torch.no_grad()
def fused_linear_ce_forward_logit_sum_per_tile(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                               reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                               chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       stats=_stats_sum_not_carried)


@torch.no_grad()
def fused_linear_ce_forward_onehot_local_col(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                             reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                             chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       grad=_grad_local_onehot)


@torch.no_grad()
def fused_linear_ce_forward_ignored_rows_grad(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                              reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                              chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       grad=_grad_no_ignore)


@torch.no_grad()
def fused_linear_ce_forward_fp32_dw_dtype(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                          reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                          chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="fp32_dw_dtype")


@torch.no_grad()
def fused_linear_ce_forward_no_bias_in_recompute(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                                 reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                                 chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="no_bias_in_recompute")


@torch.no_grad()
def fused_linear_ce_forward_mean_per_chunk(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                           reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                           chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="mean_per_chunk")


@torch.no_grad()
def fused_linear_ce_forward_keeps_tiles(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                        label_smoothing=0.0, softcap=None, fp32_dw=False, chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="keeps_tiles")


@torch.no_grad()
def fused_linear_ce_forward_default_full(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                         label_smoothing=0.0, softcap=None, fp32_dw=False, chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="default_full")


@torch.no_grad()
def fused_linear_ce_forward_always_fp32_dw(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                           reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                           chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="always_fp32_dw")


@torch.no_grad()
def fused_linear_ce_forward_cached_scratch(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                           reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                           chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="cached_scratch")


@torch.no_grad()
def fused_linear_ce_forward_torch_grad(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX, reduction="mean",
                                       label_smoothing=0.0, softcap=None, fp32_dw=False, chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="torch_grad")


@torch.no_grad()
def fused_linear_ce_forward_torch_logsumexp(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                            reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                            chunks=None):
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       bug="torch_stats")


@torch.no_grad()
def fused_linear_ce_forward_always_two_pass(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                            reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                            chunks=None):
    """RIGHT: recomputes the logits in pass 2 even when a tile holds whole rows (one matmul more, no more memory),
    with blocks of 512 columns."""
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       always_two_pass=True, max_block=512)


@torch.no_grad()
def fused_linear_ce_forward_single_block(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                         reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False,
                                         chunks=None):
    """RIGHT: BLOCK = the whole tile rounded to a power of two (up to 8192 columns), so most rows take one block."""
    return _fused_core(x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, chunks,
                       max_block=8192)


# ======================================================================================================
# Exercise 4: FusedLinearCrossEntropy and fused_linear_cross_entropy
# ======================================================================================================

class _FLCE(torch.autograd.Function):
    """Correct Function; subclasses change one thing."""
    drop_softcap = False

    @staticmethod
    def forward(ctx, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw):
        loss, dx, dw, db = fused_linear_ce_forward_ref_like(x, weight, targets, bias, ignore_index, reduction,
                                                            label_smoothing, softcap, fp32_dw)
        ctx.save_for_backward(dx, dw, db)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, db = ctx.saved_tensors
        if bool(grad_loss != 1):
            for t in (dx, dw, db):
                if t is not None:
                    t.mul_(grad_loss.to(t.dtype))
        return dx, dw, None, db, None, None, None, None, None


class _FLCEIgnoresGrad(_FLCE):
    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, db = ctx.saved_tensors
        return dx, dw, None, db, None, None, None, None, None


class _FLCECopyScale(_FLCE):
    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, db = ctx.saved_tensors
        return (dx * grad_loss, dw * grad_loss, None, None if db is None else db * grad_loss,
                None, None, None, None, None)


class _FLCENoBiasGrad(_FLCE):
    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, db = ctx.saved_tensors
        if bool(grad_loss != 1):
            dx.mul_(grad_loss.to(dx.dtype))
            dw.mul_(grad_loss.to(dw.dtype))
        return dx, dw, None, None, None, None, None, None, None


class _FLCEDbUnscaled(_FLCE):
    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, db = ctx.saved_tensors
        if bool(grad_loss != 1):
            dx.mul_(grad_loss.to(dx.dtype))
            dw.mul_(grad_loss.to(dw.dtype))
        return dx, dw, None, db, None, None, None, None, None


class _FLCECtxAttrs(torch.autograd.Function):
    """Wrong since the course states contract 5 (lessons 00 and 06: tensors for backward through save_for_backward):
    gradients kept as ctx attributes, scaled in place with a Python float. Written as a right variant, when the text
    did not say it; the numbers and the memory are right."""

    @staticmethod
    def forward(ctx, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw):
        loss, dx, dw, db = fused_linear_ce_forward_always_two_pass(x, weight, targets, bias, ignore_index,
                                                                   reduction, label_smoothing, softcap, fp32_dw)
        ctx.grads = (dx, dw, db)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, db = ctx.grads
        ctx.grads = None
        g = float(grad_loss)
        if g != 1.0:
            dx.mul_(g)
            dw.mul_(g)
            if db is not None:
                db.mul_(g)
        return dx, dw, None, db, None, None, None, None, None


def _flce(fn, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw, view=False):
    h = x.shape[-1]
    if view:
        x2, t2 = x.view(-1, h), targets.view(-1)
    else:
        x2, t2 = x.reshape(-1, h), targets.reshape(-1)
    return fn.apply(x2, weight, t2, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw)


def fused_linear_cross_entropy_ignores_grad_loss(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                                 reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    return _flce(_FLCEIgnoresGrad, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap,
                 fp32_dw)


def fused_linear_cross_entropy_copy_scale(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                          reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    return _flce(_FLCECopyScale, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap,
                 fp32_dw)


def fused_linear_cross_entropy_no_bias_grad(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                            reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    return _flce(_FLCENoBiasGrad, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap,
                 fp32_dw)


def fused_linear_cross_entropy_db_unscaled(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                           reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    return _flce(_FLCEDbUnscaled, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap,
                 fp32_dw)


def fused_linear_cross_entropy_drops_softcap(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                             reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    return _flce(_FLCE, x, weight, targets, bias, ignore_index, reduction, label_smoothing, None, fp32_dw)


def fused_linear_cross_entropy_view_flatten(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                            reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    return _flce(_FLCE, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw,
                 view=True)


def fused_linear_cross_entropy_last_dim_only(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                             reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    # (..., H) taken to mean (B, T, H) or (N, H): flattens only the first two dims of a 3-D input
    if x.dim() == 3:
        x2, t2 = x.flatten(0, 1), targets.flatten(0, 1)
    else:
        x2, t2 = x, targets
    return _FLCE.apply(x2, weight, t2, bias, ignore_index, reduction, label_smoothing, softcap, fp32_dw)


def fused_linear_cross_entropy_ctx_attrs(x, weight, targets, bias=None, ignore_index=IGNORE_INDEX,
                                         reduction="mean", label_smoothing=0.0, softcap=None, fp32_dw=False):
    """RIGHT: flattening with reshape, gradients as ctx attributes, a float scale, forward always two-pass."""
    return _flce(_FLCECtxAttrs, x, weight, targets, bias, ignore_index, reduction, label_smoothing, softcap,
                 fp32_dw)


BLIND = {
    "cross_entropy_with_grad": {
        "wrong": [
            "cross_entropy_with_grad_no_max_shift",
            "cross_entropy_with_grad_all_ignored_nan",
            "cross_entropy_with_grad_mean_over_all_tokens",
            "cross_entropy_with_grad_ignored_rows_keep_grad",
            "cross_entropy_with_grad_smoothing_full_onehot",
            "cross_entropy_with_grad_smoothing_unmasked",
            "cross_entropy_with_grad_softcap_no_derivative",
            "cross_entropy_with_grad_fp32_dlogits",
            "cross_entropy_with_grad_always_mean",
            "cross_entropy_with_grad_hardcoded_ignore",
        ],
        "right": ["cross_entropy_with_grad_log_softmax"],
    },
    "chunked_linear_ce": {
        "wrong": [
            "chunked_linear_ce_mean_per_chunk",
            "chunked_linear_ce_drops_tail",
            "chunked_linear_ce_no_bias_in_logits",
            "chunked_linear_ce_full_logits",
            "chunked_linear_ce_default_one_chunk",
            "chunked_linear_ce_sum_scaled_as_mean",
        ],
        "right": ["chunked_linear_ce_reverse_order"],
    },
    "fused_linear_ce_forward": {
        "wrong": [
            "fused_linear_ce_forward_no_rescale_across_tiles",
            "fused_linear_ce_forward_softcap_pad_lanes",
            "fused_linear_ce_forward_target_logit_uncapped",
            "fused_linear_ce_forward_logit_sum_per_tile",
            "fused_linear_ce_forward_onehot_local_col",
            "fused_linear_ce_forward_ignored_rows_grad",
            "fused_linear_ce_forward_fp32_dw_dtype",
            "fused_linear_ce_forward_no_bias_in_recompute",
            "fused_linear_ce_forward_mean_per_chunk",
            "fused_linear_ce_forward_torch_logsumexp",
        ],
        "right": ["fused_linear_ce_forward_always_two_pass", "fused_linear_ce_forward_single_block"],
    },
    "fused_linear_ce_memory": {
        "wrong": [
            "fused_linear_ce_forward_keeps_tiles",
            "fused_linear_ce_forward_default_full",
            "fused_linear_ce_forward_always_fp32_dw",
            "fused_linear_ce_forward_cached_scratch",
            "fused_linear_ce_forward_torch_grad",
            "fused_linear_ce_forward_torch_logsumexp",
        ],
        "right": ["fused_linear_ce_forward_always_two_pass", "fused_linear_ce_forward_single_block"],
    },
    "fused_linear_cross_entropy": {
        "wrong": [
            "fused_linear_cross_entropy_ignores_grad_loss",
            "fused_linear_cross_entropy_copy_scale",
            "fused_linear_cross_entropy_no_bias_grad",
            "fused_linear_cross_entropy_db_unscaled",
            "fused_linear_cross_entropy_drops_softcap",
            "fused_linear_cross_entropy_view_flatten",
            "fused_linear_cross_entropy_last_dim_only",
            "fused_linear_cross_entropy_ctx_attrs",
        ],
        "right": [],
    },
}

WHY = {
    "fused_linear_cross_entropy_ctx_attrs":
        "dX, dW and db kept as ctx attributes: the text asks for ctx.save_for_backward (lesson 00's contract 5)",
    "cross_entropy_with_grad_no_max_shift":
        "softmax/logsumexp without subtracting the row max: exp overflows to inf for logits above ~88 (the text "
        "says the pass needs 'the maximum and the sum of the exponentials')",
    "cross_entropy_with_grad_all_ignored_nan":
        "divides by the count of non-ignored tokens unguarded: NaN when every token is ignored ('return a loss of 0 "
        "and zero gradients')",
    "cross_entropy_with_grad_mean_over_all_tokens":
        "mean divides by N, not by 'the number of non-ignored tokens'",
    "cross_entropy_with_grad_ignored_rows_keep_grad":
        "ignored tokens are masked out of the loss but keep their softmax gradient ('contribute nothing, to the loss "
        "or the gradient')",
    "cross_entropy_with_grad_smoothing_full_onehot":
        "label-smoothing gradient subtracts the full one-hot instead of (1 - eps)[j = t]",
    "cross_entropy_with_grad_smoothing_unmasked":
        "the eps*(lse - mean z) smoothing term is added for ignored tokens too (only the NLL part is masked)",
    "cross_entropy_with_grad_softcap_no_derivative":
        "softcap applied to the logits but the gradient misses the chain-rule factor 1 - tanh^2(z/c)",
    "cross_entropy_with_grad_fp32_dlogits":
        "dlogits returned in fp32 for fp16/bf16 logits ('dlogits of the logits' shape and dtype')",
    "cross_entropy_with_grad_always_mean":
        "reduction argument ignored: reduction='sum' still divides by the token count",
    "cross_entropy_with_grad_hardcoded_ignore":
        "compares targets with the constant -100 instead of the ignore_index argument",
    "chunked_linear_ce_mean_per_chunk":
        "'the trap': averages per-chunk means, wrong with a partial last chunk or ignored tokens spread unevenly",
    "chunked_linear_ce_drops_tail":
        "loops over N // C chunks: the last partial chunk (N not a multiple of chunk_size) is never processed",
    "chunked_linear_ce_no_bias_in_logits":
        "logits_c = x_c W^T without '+ b' (db is still accumulated)",
    "chunked_linear_ce_full_logits":
        "computes the full N x V logits once and slices chunks from it ('no tensor of N x V elements may exist')",
    "chunked_linear_ce_default_one_chunk":
        "chunk_size=None taken as one chunk of all N tokens instead of Liger's rule: N x V logits on the default path",
    "chunked_linear_ce_sum_scaled_as_mean":
        "applies the 1/n_valid scaling whatever reduction is: reduction='sum' comes out as a mean",
    "fused_linear_ce_forward_no_rescale_across_tiles":
        "online softmax across vocabulary tiles merges l without rescaling the earlier tiles' sum to the new max",
    "fused_linear_ce_forward_softcap_pad_lanes":
        "masked lanes loaded as -inf then softcapped become -c, not -inf, and enter l (tile width not a multiple "
        "of BLOCK, with softcap)",
    "fused_linear_ce_forward_target_logit_uncapped":
        "stats kernel stores the raw target logit, not softcapped: loss wrong with softcap ('the loss sees c tanh(z/c)')",
    "fused_linear_ce_forward_logit_sum_per_tile":
        "row's sum of logits for label smoothing restarts in every tile instead of accumulating across tiles",
    "fused_linear_ce_forward_onehot_local_col":
        "grad kernel's one-hot compares the tile-local column with the target, forgetting col0",
    "fused_linear_ce_forward_ignored_rows_grad":
        "grad kernel writes softmax*scale for ignored tokens ('zeros for an ignored token')",
    "fused_linear_ce_forward_fp32_dw_dtype":
        "with fp32_dw=True returns the fp32 accumulator as dw instead of the weight's dtype",
    "fused_linear_ce_forward_no_bias_in_recompute":
        "pass 2 recomputes the tile's logits without the bias (pass 1 had it): wrong gradients with a bias and Vc < V",
    "fused_linear_ce_forward_mean_per_chunk":
        "the trap again in ex. 3: gradient scale 1/(non-ignored tokens of the chunk), not of the whole batch",
    "fused_linear_ce_forward_keeps_tiles":
        "keeps every pass-1 tile alive to skip recomputation: scratch of C x V whatever the plan",
    "fused_linear_ce_forward_default_full":
        "chunks=None taken as (N, V) instead of chunk_plan's: the full N x V logits on the default path",
    "fused_linear_ce_forward_always_fp32_dw":
        "always accumulates dW in an fp32 V x H buffer, extra memory when fp32_dw=False with low-precision inputs",
    "fused_linear_ce_forward_cached_scratch":
        "caches the logits tile in a module-level dict for reuse: scratch kept alive after return",
    "fused_linear_ce_forward_torch_grad":
        "dlogits computed in PyTorch (exp, scatter) from an fp32 copy of the tile instead of ce_grad_kernel in place",
    "fused_linear_ce_forward_torch_logsumexp":
        "pass-1 statistics by torch.logsumexp on an fp32 copy of the tile ('the check refuses ... logsumexp')",
    "fused_linear_cross_entropy_ignores_grad_loss":
        "backward returns the saved gradients without multiplying by the upstream gradient g",
    "fused_linear_cross_entropy_copy_scale":
        "backward scales out of place (dw * g): a second dW ('in place, since a copy would double dW')",
    "fused_linear_cross_entropy_no_bias_grad":
        "backward returns None for the bias: not 'differentiable in x, weight and bias'",
    "fused_linear_cross_entropy_db_unscaled":
        "backward scales dx and dw by g but forgets db",
    "fused_linear_cross_entropy_drops_softcap":
        "the wrapper forgets to pass softcap through to the Function (passes None)",
    "fused_linear_cross_entropy_view_flatten":
        "flattens x (..., H) with .view: fails for a non-contiguous x that reshape would accept",
    "fused_linear_cross_entropy_last_dim_only":
        "handles only (N, H) and (B, T, H): x of 4 or more dims ('x of shape (..., H)') reaches the Function unflattened",
}
