"""Known-wrong (and known-right alternative) implementations of lesson 04's exercises."""
import torch
import triton
import triton.language as tl

import memfit
import memfit.from_lessons.kernel_fusion as ref


# ------------------------------------------------------------------------------------------- pow4
@triton.jit
def _pow4_unmasked_kernel(a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offsets, mask=offsets < n, other=1.0).to(tl.float32)
    tl.store(b_ptr + offsets, (a * a * a * a).to(b_ptr.dtype.element_ty))  # no mask on the store


def pow4_unmasked_store(a, out=None):
    out = torch.empty_like(a) if out is None else out
    _pow4_unmasked_kernel[(triton.cdiv(a.numel(), 1024),)](a, out, a.numel(), BLOCK=1024)
    return out


def pow4_one_block_short(a, out=None):  # the grid floors instead of rounding up: the tail is never written
    out = torch.empty_like(a) if out is None else out
    ref.pow4_kernel[(max(1, a.numel() // 1024),)](a, out, a.numel(), BLOCK=1024)
    return out


def pow4_with_torch(a, out=None):  # eager: right numbers, three kernels and two temporaries
    result = a * a * a * a
    return out.copy_(result) if out is not None else result


def pow4_other_block(a, out=None):  # right: another block size
    if not a.is_contiguous():
        raise ValueError("pow4 reads a as a flat array: pass a contiguous tensor")
    out = torch.empty_like(a) if out is None else out
    ref.pow4_kernel[(triton.cdiv(a.numel(), 256),)](a, out, a.numel(), BLOCK=256)
    return out


# ---------------------------------------------------------------------------------------- RMSNorm
def rmsnorm_forward_mean_not_rms(x, weight, eps=1e-5):  # divides by mean(|x|)... via a wrong eps placement
    y, rstd = ref.rmsnorm_forward(x, weight, eps)
    rstd = rstd * (1 + 1e-2)
    rows = x.reshape(-1, x.shape[-1]).float()
    return (rows * rstd[:, None] * weight.float()).to(x.dtype).view(x.shape), rstd


def rmsnorm_forward_rstd_in_x_dtype(x, weight, eps=1e-5):
    y, rstd = ref.rmsnorm_forward(x, weight, eps)
    return y, rstd.to(x.dtype)


def rmsnorm_backward_without_projection(dy, x, weight, rstd):  # dx = r * w * dy: forgets the mean term
    dx, dw = ref.rmsnorm_backward(dy, x, weight, rstd)
    rows = rstd.view(*x.shape[:-1], 1)
    return (rows * weight.float() * dy.float()).to(x.dtype), dw


def rmsnorm_backward_dw_of_last_program(dy, x, weight, rstd):  # partial sums never added up
    dx, _ = ref.rmsnorm_backward(dy, x, weight, rstd)
    xhat = x.reshape(-1, x.shape[-1]).float() * rstd[:, None]
    return dx, (dy.reshape(-1, x.shape[-1]).float() * xhat)[-1].to(weight.dtype)


@triton.jit
def _rmsnorm_forward_looped_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    """One program per row, two passes over blocks of BLOCK columns: the sum of squares, then y."""
    row = tl.program_id(0)
    base = row.to(tl.int64) * stride
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        squares += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def rmsnorm_forward_in_column_blocks(x, weight, eps=1e-5):  # right: the row in blocks of 256, read twice
    h = x.shape[-1]
    rows = x.reshape(-1, h).contiguous()
    y = torch.empty_like(rows)
    rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    _rmsnorm_forward_looped_kernel[(rows.shape[0],)](rows, weight, y, rstd, rows.stride(0), h, eps, BLOCK=256)
    return y.view(x.shape), rstd


def rmsnorm_backward_row_per_program(dy, x, weight, rstd):  # one program per row: a (rows, h) fp32 buffer, x's size
    h = x.shape[-1]
    rows, grads = x.reshape(-1, h).contiguous(), dy.reshape(-1, h).contiguous()
    n_rows = rows.shape[0]
    dx = torch.empty_like(rows)
    partial = torch.empty(n_rows, h, dtype=torch.float32, device=x.device)
    ref.rmsnorm_backward_kernel[(n_rows,)](grads, rows, weight, rstd, dx, partial, rows.stride(0), n_rows, h, 1,
                                           BLOCK=triton.next_power_of_2(h))
    return dx.view(x.shape), partial.sum(0).to(weight.dtype)


def rmsnorm_forward_one_warp_count(x, weight, eps=1e-5):  # num_warps=8 whatever the block: right numbers
    h = x.shape[-1]
    rows = x.reshape(-1, h).contiguous()
    y, rstd = torch.empty_like(rows), torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    _rmsnorm_forward_looped_kernel[(rows.shape[0],)](rows, weight, y, rstd, rows.stride(0), h, eps,
                                                     BLOCK=triton.next_power_of_2(h), num_warps=8)
    return y.view(x.shape), rstd


@triton.jit
def _rmsnorm_backward_shared_dw_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, stride, n_rows, n_cols,
                                       rows_per_program, BLOCK: tl.constexpr):
    """As the reference's kernel, but each program adds its rows' sum into one shared fp32 row with atomics."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    start = tl.program_id(0) * rows_per_program
    for row in range(start, tl.minimum(start + rows_per_program, n_rows)):
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        g = w * dy
        dx = rstd * (g - x * rstd * (tl.sum(g * x * rstd, axis=0) / n_cols))
        tl.store(dx_ptr + row * stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * x * rstd
    tl.atomic_add(dw_ptr + cols, dw, mask=mask)


def rmsnorm_backward_atomic_dw(dy, x, weight, rstd):  # right numbers, a smaller buffer; dw's bits vary run to run
    h = x.shape[-1]
    rows, grads = x.reshape(-1, h).contiguous(), dy.reshape(-1, h).contiguous()
    n_rows = rows.shape[0]
    programs = max(1, min(ref._programs(x.device, ref._row_warps(triton.next_power_of_2(h))), n_rows))
    dx, dw = torch.empty_like(rows), torch.zeros(h, dtype=torch.float32, device=x.device)
    _rmsnorm_backward_shared_dw_kernel[(programs,)](grads, rows, weight, rstd, dx, dw, rows.stride(0), n_rows, h,
                                                    triton.cdiv(n_rows, programs), BLOCK=triton.next_power_of_2(h),
                                                    num_warps=ref._row_warps(triton.next_power_of_2(h)))
    return dx.view(x.shape), dw.to(weight.dtype)


def rmsnorm_backward_two_programs(dy, x, weight, rstd):  # right: fewer programs than the text's, longer runs each
    h = x.shape[-1]
    rows, grads = x.reshape(-1, h).contiguous(), dy.reshape(-1, h).contiguous()
    n_rows = rows.shape[0]
    programs = min(2, n_rows)
    dx = torch.empty_like(rows)
    partial = torch.empty(programs, h, dtype=torch.float32, device=x.device)
    ref.rmsnorm_backward_kernel[(programs,)](grads, rows, weight, rstd, dx, partial, rows.stride(0), n_rows, h,
                                             triton.cdiv(n_rows, programs), BLOCK=triton.next_power_of_2(h))
    return dx.view(x.shape), partial.sum(0).to(weight.dtype)


# ----------------------------------------------------------------------------------------- SwiGLU
def swiglu_backward_silu_derivative_wrong(dh, gate, up):  # d silu/dg taken as sigmoid(g)
    d = ref.swiglu_backward(dh, gate, up)
    f = gate.shape[-1]
    d[..., :f] = (dh.float() * up.float() * torch.sigmoid(gate.float())).to(gate.dtype)
    return d


def swiglu_backward_stores_silu(dh, gate, up):  # right numbers, but materialises silu(gate) with PyTorch
    s = torch.sigmoid(gate)
    return torch.cat([dh * up * s * (1 + gate * (1 - s)), dh * torch.nn.functional.silu(gate)], dim=-1)


def swiglu_forward_block_256(gate, up):  # right: blocks of 256 columns, so a row spans several programs
    g, u = ref._row_view(gate), ref._row_view(up)
    h = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    f = g.shape[1]
    ref.swiglu_forward_kernel[(g.shape[0], triton.cdiv(f, 256))](g, u, h, g.stride(0), u.stride(0), f, BLOCK=256)
    return h


def swiglu_backward_block_256(dh, gate, up):  # right: blocks of 256 columns
    g, u, grads = ref._row_view(gate), ref._row_view(up), dh.contiguous()
    f = g.shape[1]
    d = torch.empty(*gate.shape[:-1], 2 * f, dtype=gate.dtype, device=gate.device)
    ref.swiglu_backward_kernel[(g.shape[0], triton.cdiv(f, 256))](grads, g, u, d, g.stride(0), u.stride(0), f,
                                                                   BLOCK=256)
    return d


def swiglu_forward_contiguous_only(gate, up):  # ignores the row stride: reads the wrong half of w13's output
    g, u = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
    h = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    f = g.shape[1]
    grid = (g.shape[0], triton.cdiv(f, 1024))
    ref.swiglu_forward_kernel[grid](g, u, h, f, f, f, BLOCK=1024)
    return h


# ----------------------------------------------------------------------------------- modules, savings
def use_fused_norms_only(model):  # SwiGLU left eager
    from memfit.gpt import RMSNorm
    for module in model.modules():
        if type(module) is RMSNorm:
            module.__class__ = ref.FusedRMSNorm
    return model


def savings_without_rstd_correction(cfg, batch, seq, dtype_bytes):  # forgets the fp32 r the fused norm keeps
    tokens = batch * seq
    return 2 * (dtype_bytes * tokens * cfg.d_model + dtype_bytes * tokens) + dtype_bytes * tokens * cfg.ffn_hidden


def savings_counts_one_norm(cfg, batch, seq, dtype_bytes):
    tokens = batch * seq
    return dtype_bytes * tokens * cfg.d_model + dtype_bytes * tokens - 4 * tokens + dtype_bytes * tokens * cfg.ffn_hidden
