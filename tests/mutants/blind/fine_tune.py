"""Blind set for lesson 08_fine_tune: written from the exercise text alone (lessons/08_fine_tune.ipynb)."""
import memfit  # noqa: F401  (first: decides TRITON_INTERPRET before triton is imported)

import contextlib
import statistics

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit.fake import FakeTensors

from memfit.from_lessons.fine_tune import (  # the lesson's given code (non-exercise cells)
    ADAM_STATE_BYTES, ADAPTER_BYTES, BASE_DTYPES, LORA_TARGETS, NF4, NF4_BLOCK, NF4_OFFSET, add_lora,
    check_lora_inputs,
)
from memfit.from_lessons.model_states import count_params
from memfit.gpt import GPT, unique_parameters
from memfit.meter import LIVE_TENSORS, measure_peak
from memfit.training import StepMemory, measure_step, random_batch

DEFAULT = ("wqkv", "wo", "w13", "w2")


# ============================================================================================================
# Exercise 1: lora_state_bytes
# ============================================================================================================

def _dims(cfg, *, gqa=True, w13_width=2):
    """(d_in, d_out) of every target."""
    h, f = cfg.d_model, cfg.ffn_hidden
    kv = (cfg.n_kv_heads if gqa else cfg.n_heads) * cfg.head_dim
    return {"wqkv": (h, h + 2 * kv), "wo": (h, h), "w13": (h, w13_width * f), "w2": (f, h),
            "head": (h, cfg.vocab_size)}


def _validate(r, targets, base_dtype, *, r_check="strict", dedup=False, dtype_check=True):
    if r_check == "strict":
        if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
            raise ValueError(f"r must be a positive int, not {r!r}")
    elif r_check == "sign_only":
        if r <= 0:
            raise ValueError(f"r must be positive, not {r!r}")
    elif r_check == "typeerror":
        if not isinstance(r, int):
            raise TypeError(f"r must be an int, not {type(r).__name__}")
        if r <= 0:
            raise ValueError(f"r must be positive, not {r!r}")
    targets = tuple(targets)
    if not targets:
        raise ValueError("targets must not be empty")
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad:
        raise ValueError(f"targets must be among {LORA_TARGETS}, not {bad}")
    if dedup:
        targets = tuple(dict.fromkeys(targets))
    elif len(set(targets)) != len(targets):
        raise ValueError(f"targets has a repeated entry: {targets}")
    if dtype_check and base_dtype not in BASE_DTYPES:
        raise ValueError(f"base_dtype must be fp32, fp16 or bf16, not {base_dtype}")
    return targets


def _lora_bytes(cfg, r, targets, base_dtype, *, gqa=True, w13_width=2, hf_split=False, head_per_layer=False,
                adapter_bytes=ADAPTER_BYTES, adapter_in_base=False, opt_bytes=ADAM_STATE_BYTES, untied_base=False,
                tied_head_skipped=False, **validate):
    targets = _validate(r, targets, base_dtype, **validate)
    dims = _dims(cfg, gqa=gqa, w13_width=w13_width)
    trainable = 0
    for t in targets:
        if t == "head" and tied_head_skipped and cfg.tie_embeddings:
            continue
        d_in, d_out = dims[t]
        per = r * (d_in + d_out)
        if t == "w13" and hf_split:
            per = 2 * r * (cfg.d_model + cfg.ffn_hidden)
        times = cfg.n_layers if (t != "head" or head_per_layer) else 1
        trainable += times * per
    base = count_params(cfg)
    if untied_base and cfg.tie_embeddings:
        base += cfg.vocab_size * cfg.d_model
    item = base_dtype.itemsize
    a_bytes = item if adapter_in_base else adapter_bytes
    return {"trainable": trainable, "params": base * item + trainable * a_bytes,
            "grads": trainable * a_bytes, "optimizer": trainable * opt_bytes}


# --- right ---

def lora_state_bytes_formula(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """RIGHT: each target's r*(d_in + d_out), n_layers times (the head once); base = count_params in base_dtype."""
    return _lora_bytes(cfg, r, targets, base_dtype)


def lora_state_bytes_meta_model(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """RIGHT: builds the course GPT on the meta device, wraps it with the given add_lora and counts parameters
    (frozen ones in base_dtype, trainable ones in fp32); validation done first."""
    targets = _validate(r, targets, base_dtype)
    with torch.device("meta"):
        model = add_lora(GPT(cfg), r, 16.0, targets)
    params = unique_parameters(model)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    frozen = sum(p.numel() for p in params if not p.requires_grad)
    item = torch.finfo(base_dtype).bits // 8
    return {"trainable": int(trainable), "params": int(frozen * item + trainable * ADAPTER_BYTES),
            "grads": int(trainable * ADAPTER_BYTES), "optimizer": int(trainable * ADAM_STATE_BYTES)}


def lora_state_bytes_per_block(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """RIGHT: validates base_dtype and r first, sums a per-block adapter count with a dict of widths; element size
    from an empty tensor of base_dtype."""
    if base_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"base_dtype: expected fp32, fp16 or bf16, got {base_dtype!r}")
    if type(r) is not int or r < 1:
        raise ValueError(f"r: expected a positive int, got {r!r}")
    targets = list(targets)
    if len(targets) == 0 or any(t not in LORA_TARGETS for t in targets) or len(set(targets)) < len(targets):
        raise ValueError(f"targets: expected distinct names among {LORA_TARGETS}, got {targets!r}")
    h, f, kv = cfg.d_model, cfg.ffn_hidden, cfg.d_model * cfg.n_kv_heads // cfg.n_heads
    width = {"wqkv": h + h + 2 * kv, "wo": 2 * h, "w13": h + 2 * f, "w2": f + h}
    per_block = sum(width[t] for t in targets if t != "head")
    trainable = r * (cfg.n_layers * per_block + ((h + cfg.vocab_size) if "head" in targets else 0))
    item = torch.empty((), dtype=base_dtype).element_size()
    return {"trainable": trainable, "params": count_params(cfg) * item + 4 * trainable,
            "grads": 4 * trainable, "optimizer": 8 * trainable}


# --- wrong ---

def lora_state_bytes_no_gqa(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """wqkv's output width taken as 3 * d_model (K and V as wide as Q): ignores GQA."""
    return _lora_bytes(cfg, r, targets, base_dtype, gqa=False)


def lora_state_bytes_hf_split_w13(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """w13 counted as Hugging Face's two adapters (gate, up): 2 r (h + f) instead of r (h + 2f)."""
    return _lora_bytes(cfg, r, targets, base_dtype, hf_split=True)


def lora_state_bytes_w13_single_width(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """w13 as d_model -> ffn_hidden (forgets that gate and up are one matrix of 2 * ffn_hidden)."""
    return _lora_bytes(cfg, r, targets, base_dtype, w13_width=1)


def lora_state_bytes_head_per_layer(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """The head's adapter counted in every block like the others."""
    return _lora_bytes(cfg, r, targets, base_dtype, head_per_layer=True)


def lora_state_bytes_adapter_base_dtype(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """Adapters and their gradients in the base's dtype (they are fp32 whatever the base's dtype)."""
    return _lora_bytes(cfg, r, targets, base_dtype, adapter_in_base=True)


def lora_state_bytes_adam_two_times_eight(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """AdamW's "two fp32 states" multiplied by ADAM_STATE_BYTES, which already holds both: 16 bytes per parameter."""
    return _lora_bytes(cfg, r, targets, base_dtype, opt_bytes=2 * ADAM_STATE_BYTES)


def lora_state_bytes_untied_base(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """Base counted with a separate head even when tied (a vocab x d_model matrix too many)."""
    return _lora_bytes(cfg, r, targets, base_dtype, untied_base=True)


def lora_state_bytes_tied_head_skipped(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """A tied head gets no adapter (it "is" the embedding): its r (h + V) adapter parameters dropped."""
    return _lora_bytes(cfg, r, targets, base_dtype, tied_head_skipped=True)


def lora_state_bytes_float_r(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """Validates r > 0 only: r = 8.0 accepted (float values returned)."""
    return _lora_bytes(cfg, r, targets, base_dtype, r_check="sign_only")


def lora_state_bytes_dedup_targets(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """Repeated targets silently deduplicated instead of raising."""
    return _lora_bytes(cfg, r, targets, base_dtype, dedup=True)


def lora_state_bytes_any_dtype(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """No check of base_dtype: fp64 (or int8) bases accepted through itemsize."""
    return _lora_bytes(cfg, r, targets, base_dtype, dtype_check=False)


def lora_state_bytes_typeerror_r(cfg, r, targets=DEFAULT, base_dtype=torch.bfloat16) -> dict:
    """A non-int r raises TypeError, not ValueError."""
    return _lora_bytes(cfg, r, targets, base_dtype, r_check="typeerror")


# ============================================================================================================
# Exercise 2: LoRAFunction
# ============================================================================================================

def _lora_fn(name, *, check=True, inplace=True, merged_forward=False, save_x="ref", save_low=False,
             save_scaled_xa=False, out_fp32=False, needs="right", da_scale=True, dx_lora=True, dx_merged=False,
             da_via_dyTx=False, backward_view=False, einsum=False, scale_dyb=False):
    class _LoRA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, lora_a, lora_b, scale):
            if check:
                check_lora_inputs(x, weight, lora_a, lora_b)
            low = None
            if einsum:
                xa = torch.einsum("...i,ri->...r", x, lora_a)
                y = torch.einsum("...i,oi->...o", x, weight)
                y.add_(torch.einsum("...r,or->...o", xa, lora_b), alpha=scale)
            elif out_fp32:
                xa = x @ lora_a.T
                y = x.float() @ weight.float().T + scale * (xa.float() @ lora_b.float().T)
            elif merged_forward:
                xa = x @ lora_a.T
                y = x @ (weight + scale * (lora_b @ lora_a)).T
            else:
                xa = x @ lora_a.T
                low = xa @ lora_b.T
                if inplace:
                    y = x @ weight.T
                    y.add_(low, alpha=scale)
                else:
                    y = x @ weight.T + scale * low
            xs = x
            if save_x == "reshape_contiguous":
                xs = x.reshape(-1, x.shape[-1]).contiguous()
            elif save_x == "fp32":
                xs = x.float()
            extra = (low,) if save_low else ()
            ctx.save_for_backward(xs, weight, lora_a, lora_b, xa * scale if save_scaled_xa else xa, *extra)
            ctx.scale, ctx.x_shape = scale, x.shape
            return y

        @staticmethod
        def backward(ctx, dy):
            xs, weight, lora_a, lora_b, xa = ctx.saved_tensors[:5]
            s = ctx.scale
            (d_out, d_in), r = weight.shape, lora_a.shape[0]

            def flat(t, n):
                return t.view(-1, n) if backward_view else t.reshape(-1, n)

            if needs == "right":
                nx, na, nb = ctx.needs_input_grad[0], ctx.needs_input_grad[2], ctx.needs_input_grad[3]
            elif needs == "ignore":
                nx = na = nb = True
            else:  # "offbyone": (x, lora_a, lora_b) read as positions 0, 1, 2
                nx, na, nb = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
            dy2 = flat(dy, d_out)
            dyb = dy2 @ lora_b if (na or (nx and dx_lora and not dx_merged)) else None
            if dyb is not None and scale_dyb:
                dyb = dyb * s
            dx = da = db = None
            if nx:
                if dx_merged:
                    dx = dy2 @ (weight + s * (lora_b @ lora_a))
                else:
                    dx = dy2 @ weight
                    if dx_lora:
                        dx.addmm_(dyb, lora_a, alpha=1.0 if scale_dyb else s)
                dx = dx.reshape(ctx.x_shape)
            if na:
                x2 = flat(xs, d_in).to(dy.dtype)
                if da_via_dyTx:
                    da = (lora_b.T @ (dy2.T @ x2)) * s
                else:
                    da = dyb.T @ x2
                    if da_scale and not scale_dyb:
                        da = da * s
            if nb:
                db = (dy2.T @ flat(xa, r)) * s
            return dx, None, da, db, None

    _LoRA.__name__ = _LoRA.__qualname__ = name
    return _LoRA


# --- right ---

LoRAFunction_plain = _lora_fn("LoRAFunction_plain", inplace=False)
"""RIGHT: the obvious one: y = x @ W.T + scale * (xa @ B.T); backward with reshapes and needs_input_grad."""

LoRAFunction_inplace = _lora_fn("LoRAFunction_inplace")
"""RIGHT: the base output accumulates the update in place (y.add_(low, alpha=scale)); dx.addmm_ in backward."""

LoRAFunction_einsum = _lora_fn("LoRAFunction_einsum", einsum=True, scale_dyb=True)
"""RIGHT: einsum forward; backward scales dy B once and reuses it for dA and dx."""


# --- wrong (numerics) ---

LoRAFunction_dA_no_scale = _lora_fn("LoRAFunction_dA_no_scale", da_scale=False)
"""dL/dA without the factor s."""

LoRAFunction_dx_base_only = _lora_fn("LoRAFunction_dx_base_only", dx_lora=False)
"""dx = dy W only: forgets the adapter's s (dy B) A term."""

LoRAFunction_needs_offbyone = _lora_fn("LoRAFunction_needs_offbyone", needs="offbyone")
"""needs_input_grad read at 0, 1, 2 for (x, A, B): position 1 is weight, so dA (and dB) are never computed."""

LoRAFunction_double_scale = _lora_fn("LoRAFunction_double_scale", save_scaled_xa=True)
"""Saves s * (x A^T) and multiplies dB by s again: dB carries s^2."""

LoRAFunction_fp32_out = _lora_fn("LoRAFunction_fp32_out", out_fp32=True)
"""Computes y in fp32 for accuracy and forgets to cast back: y is fp32 for 16-bit inputs."""

LoRAFunction_view_in_backward = _lora_fn("LoRAFunction_view_in_backward", backward_view=True)
"""x.view(-1, d_in) in the backward: fails on a strided x (reshape needed)."""

LoRAFunction_no_input_check = _lora_fn("LoRAFunction_no_input_check", check=False)
"""Skips check_lora_inputs: mismatched shapes or dtypes raise RuntimeError from matmul, not ValueError."""


# --- wrong (memory) ---

LoRAFunction_saves_contiguous_x = _lora_fn("LoRAFunction_saves_contiguous_x", save_x="reshape_contiguous")
"""Saves x.reshape(-1, d_in).contiguous(): a copy of a strided x kept for backward."""

LoRAFunction_saves_x_fp32 = _lora_fn("LoRAFunction_saves_x_fp32", save_x="fp32")
"""Saves x.float() (for accurate gradients): an fp32 copy of a 16-bit x kept for backward."""

LoRAFunction_saves_low_rank_out = _lora_fn("LoRAFunction_saves_low_rank_out", save_low=True)
"""Also saves (x A^T) B^T, an output-sized intermediate, as autograd would."""

LoRAFunction_merged_forward = _lora_fn("LoRAFunction_merged_forward", merged_forward=True)
"""Forward merges W + s B A (a W-sized matrix) and does one matmul."""

LoRAFunction_ignores_needs = _lora_fn("LoRAFunction_ignores_needs", needs="ignore")
"""Ignores ctx.needs_input_grad: computes dx (tokens x d_in) even when x needs no gradient."""

LoRAFunction_dx_merged = _lora_fn("LoRAFunction_dx_merged", dx_merged=True)
"""Backward computes dx = dy (W + s B A): a W-sized matrix."""

LoRAFunction_dA_via_dyTx = _lora_fn("LoRAFunction_dA_via_dyTx", da_via_dyTx=True)
"""dA = s B^T (dy^T x): the W-sized product dy^T x (associativity in the wrong order)."""


# ============================================================================================================
# Exercise 3: nf4_code
# ============================================================================================================

def _levels64(neg_probs=8, neg_count=7, zero=True):
    pos = torch.special.ndtri(torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -torch.special.ndtri(torch.linspace(NF4_OFFSET, 0.5, neg_probs, dtype=torch.float64)[:-1])[:neg_count]
    parts = [pos, neg] + ([torch.zeros(1, dtype=torch.float64)] if zero else [])
    v = torch.cat(parts).sort().values
    return v / v.max()


def nf4_code_ndtri() -> torch.Tensor:
    """RIGHT: ndtri of the two linspaces in float64, a zero, sorted, divided by the largest, then fp32."""
    return _levels64().float()


def nf4_code_statistics() -> torch.Tensor:
    """RIGHT: Python floats (float64) and statistics.NormalDist().inv_cdf, probabilities by formula."""
    nd = statistics.NormalDist()
    d = NF4_OFFSET
    pos = [nd.inv_cdf(d + (0.5 - d) * i / 8) for i in range(8)]
    neg = [-nd.inv_cdf(d + (0.5 - d) * i / 7) for i in range(7)]
    levels = sorted(pos + neg + [0.0])
    top = max(levels)
    return torch.tensor([v / top for v in levels], dtype=torch.float64).to(torch.float32)


def nf4_code_neg_same_probs() -> torch.Tensor:
    """"likewise 7 negative ones" read as the first 7 probabilities of the positive side: a symmetric code."""
    return _levels64(neg_probs=9, neg_count=7).float()


def nf4_code_eight_negative_no_zero() -> torch.Tensor:
    """16 levels as 8 positive and 8 negative (linspace(δ, 0.5, 9) on both sides), no zero level."""
    return _levels64(neg_probs=9, neg_count=8, zero=False).float()


# ============================================================================================================
# Exercise 4: quantize_nf4, dequantize_nf4
# ============================================================================================================

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _q(w, *, right=False, search="bucketize", zero="divide_by_one", low_div=False, absmax_low=False,
       low_first=False, strided=False, dtype_check=True, pad=False):
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w must be a 2-D tensor, got {getattr(w, 'shape', type(w))}")
    if dtype_check and w.dtype not in _FLOATS:
        raise ValueError(f"w must be fp32, fp16 or bf16, not {w.dtype}")
    shape, dtype = tuple(w.shape), w.dtype
    if w.shape[1] % NF4_BLOCK:
        if not pad:
            raise ValueError(f"w's last dimension ({w.shape[1]}) must be a multiple of {NF4_BLOCK}")
        w = F.pad(w, (0, NF4_BLOCK - w.shape[1] % NF4_BLOCK))
    d_out, d_in = w.shape
    nb = d_in // NF4_BLOCK
    if strided:  # block j = columns j, j + nb, j + 2 nb, ...
        blocks = w.float().reshape(d_out, NF4_BLOCK, nb).transpose(1, 2)
    else:
        blocks = w.float().reshape(d_out, nb, NF4_BLOCK)
    absmax = blocks.abs().amax(-1)
    if zero == "divide_by_one":
        denom = torch.where(absmax == 0, torch.ones_like(absmax), absmax)
    elif zero == "store_one":
        absmax = torch.where(absmax == 0, torch.ones_like(absmax), absmax)
        denom = absmax
    else:  # "unguarded": 0 / 0
        denom = absmax
    if low_div:
        scaled = (w.reshape(d_out, nb, NF4_BLOCK) / denom.to(w.dtype)[..., None]).float()
    else:
        scaled = blocks / denom[..., None]
    code = nf4_code_ndtri().to(w.device)
    mids = (code[1:] + code[:-1]) / 2
    if search == "bucketize":
        idx = torch.bucketize(scaled, mids, right=right)
    elif search == "count":
        idx = (scaled.unsqueeze(-1) > mids).sum(-1)
    else:  # "argmin"
        idx = (scaled.unsqueeze(-1) - code).abs().argmin(-1)
    if strided:
        idx = idx.transpose(1, 2)
    idx = idx.reshape(d_out, d_in).to(torch.uint8)
    hi, lo = idx[:, 0::2], idx[:, 1::2]
    if low_first:
        hi, lo = lo, hi
    codes = ((hi << 4) | lo).contiguous()
    if absmax_low:
        absmax = absmax.to(dtype)
    return NF4(codes, absmax.contiguous(), shape, dtype)


def _dq(q, *, low_first=False, table=False, strided=False, out_fp32=False, low_mul=False):
    d_out, d_in = q.codes.shape[0], 2 * q.codes.shape[1]
    nb = d_in // NF4_BLOCK
    code = nf4_code_ndtri().to(q.codes.device)
    c = q.codes.long()
    if table:  # byte b -> (code[b >> 4], code[b & 15])
        pairs = torch.stack([code.repeat_interleave(16), code.repeat(16)], dim=-1)
        vals = pairs[c].reshape(d_out, d_in)
    else:
        hi, lo = c >> 4, c & 15
        if low_first:
            hi, lo = lo, hi
        vals = code[torch.stack([hi, lo], dim=-1).reshape(d_out, d_in)]
    if strided:
        v = vals.reshape(d_out, NF4_BLOCK, nb) * q.absmax.float()[:, None, :]
    elif low_mul:
        v = vals.to(q.dtype).reshape(d_out, nb, NF4_BLOCK) * q.absmax.to(q.dtype)[..., None]
    else:
        v = vals.reshape(d_out, nb, NF4_BLOCK) * q.absmax.float()[..., None]
    out = v.reshape(d_out, d_in)[:, :q.shape[1]]
    return out.contiguous() if out_fp32 else out.to(q.dtype).contiguous()


# --- right ---

def quantize_nf4_bucketize(w):
    """RIGHT: blocks as a (d_out, d_in/64, 64) view, bucketize against fp32 midpoints, high nibble first."""
    return _q(w)


def quantize_nf4_count_midpoints(w):
    """RIGHT: index = how many midpoints lie strictly below the value (a tie stays at the lower level)."""
    return _q(w, search="count")


def dequantize_nf4_index(q):
    """RIGHT: unpack both nibbles, index the code, multiply by the fp32 absmax, cast to q.dtype."""
    return _dq(q)


def dequantize_nf4_table(q):
    """RIGHT: a 256-entry table byte -> (level of the high nibble, level of the low nibble)."""
    return _dq(q, table=True)


# --- wrong ---

def quantize_nf4_low_nibble_first(w):
    """Even column in the low nibble, odd in the high one (the round trip with its own dequantize is right)."""
    return _q(w, low_first=True)


def dequantize_nf4_low_nibble_first(q):
    return _dq(q, low_first=True)


def quantize_nf4_ties_up(w):
    """bucketize(..., right=True): a value on a midpoint goes to the upper level."""
    return _q(w, right=True)


def quantize_nf4_argmin_distance(w):
    """Nearest by argmin |v - c| in fp32, not by the fp32 midpoints: near-ties decided by rounded distances."""
    return _q(w, search="argmin")


def quantize_nf4_strided_blocks(w):
    """Blocks of 64 values of a row taken every d_in/64 columns (reshape (d_out, 64, d_in/64)), not consecutive."""
    return _q(w, strided=True)


def dequantize_nf4_strided_blocks(q):
    return _dq(q, strided=True)


def quantize_nf4_zero_block_absmax_one(w):
    """A block of zeros stores absmax 1 (instead of dividing by 1 and storing its absmax, 0)."""
    return _q(w, zero="store_one")


def quantize_nf4_zero_block_nan(w):
    """No guard: a block of zeros divides 0 by 0 (NaN goes to the top index)."""
    return _q(w, zero="unguarded")


def quantize_nf4_divide_in_input_dtype(w):
    """w / absmax computed in w's dtype (bf16/fp16), then compared with fp32 midpoints."""
    return _q(w, low_div=True)


def quantize_nf4_absmax_input_dtype(w):
    """absmax stored in w's dtype, not fp32."""
    return _q(w, absmax_low=True)


def quantize_nf4_accepts_any_dtype(w):
    """No dtype check: fp64 or integer weights quantized instead of a ValueError."""
    return _q(w, dtype_check=False)


def quantize_nf4_pads(w):
    """'padding is free': a last dimension not a multiple of 64 is zero-padded instead of rejected."""
    return _q(w, pad=True)


def dequantize_nf4_crops(q):
    return _dq(q)


def dequantize_nf4_fp32_out(q):
    """Returns the fp32 product, not the weight's dtype."""
    return _dq(q, out_fp32=True)


def dequantize_nf4_multiply_in_dtype(q):
    """code and absmax cast to q.dtype and multiplied there (double rounding), not computed in fp32."""
    return _dq(q, low_mul=True)


def _nf4(q, d):
    return {"quantize_nf4": q, "dequantize_nf4": d}


# ============================================================================================================
# Exercise 5: fake_step_memory
# ============================================================================================================

# --- right ---

def fake_step_memory_plain(make_trainer, batch: int, seq: int):
    """RIGHT: build and measure inside one FakeTensors."""
    with FakeTensors():
        trainer = make_trainer()
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_memory_reenter(make_trainer, batch: int, seq: int):
    """RIGHT: one mode object, entered twice (build, then measure), through an ExitStack."""
    mode = FakeTensors()
    with mode:
        trainer = make_trainer()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mode)
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


# --- wrong ---

def fake_step_memory_plain_mode(make_trainer, batch: int, seq: int):
    """PyTorch's FakeTensorMode itself: the course's Triton kernels launch on fake tensors there."""
    with FakeTensorMode():
        trainer = make_trainer()
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_memory_trainer_outside(make_trainer, batch: int, seq: int):
    """Builds the trainer before entering the mode: real parameters of the model's size."""
    trainer = make_trainer()
    with FakeTensorMode():
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_memory_outside_allow_real(make_trainer, batch: int, seq: int):
    """The 'fix' of the above: allow_non_fake_inputs=True; still builds real parameters of the model's size."""
    trainer = make_trainer()
    with FakeTensorMode(allow_non_fake_inputs=True):
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_memory_first_step(make_trainer, batch: int, seq: int):
    """Measures the first step (no warm-up): the optimizer states are created inside the measured step."""
    with FakeTensorMode():
        trainer = make_trainer()
        idx, targets = random_batch(trainer.cfg, batch, seq, trainer.device)
        states = trainer.state_bytes()
        _, report = measure_peak(trainer.step, idx, targets, device=trainer.device, meter=LIVE_TENSORS,
                                 warmup=False)
        return StepMemory(sum(states.values()) + report.peak_bytes, states, report.peak_bytes, report.meter)


def fake_step_memory_two_modes(make_trainer, batch: int, seq: int):
    """Builds under one FakeTensorMode and measures under a second, new one."""
    with FakeTensorMode():
        trainer = make_trainer()
    with FakeTensorMode():
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_memory_measure_after_exit(make_trainer, batch: int, seq: int):
    """Builds inside the mode, measures after leaving it (the batch is then a real tensor)."""
    with FakeTensorMode():
        trainer = make_trainer()
    return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


# ============================================================================================================

_LORA_RIGHT = ["LoRAFunction_plain", "LoRAFunction_inplace", "LoRAFunction_einsum"]

BLIND = {
    "lora_state_bytes": {
        "wrong": ["lora_state_bytes_no_gqa", "lora_state_bytes_hf_split_w13", "lora_state_bytes_w13_single_width",
                  "lora_state_bytes_head_per_layer", "lora_state_bytes_adapter_base_dtype",
                  "lora_state_bytes_adam_two_times_eight", "lora_state_bytes_untied_base",
                  "lora_state_bytes_tied_head_skipped", "lora_state_bytes_float_r", "lora_state_bytes_dedup_targets",
                  "lora_state_bytes_any_dtype", "lora_state_bytes_typeerror_r"],
        "right": ["lora_state_bytes_formula", "lora_state_bytes_meta_model", "lora_state_bytes_per_block"],
    },
    "lora_function": {
        "wrong": ["LoRAFunction_dA_no_scale", "LoRAFunction_dx_base_only", "LoRAFunction_needs_offbyone",
                  "LoRAFunction_double_scale", "LoRAFunction_fp32_out", "LoRAFunction_view_in_backward",
                  "LoRAFunction_no_input_check"],
        "right": _LORA_RIGHT,
    },
    "lora_memory": {
        "wrong": ["LoRAFunction_saves_contiguous_x", "LoRAFunction_saves_x_fp32", "LoRAFunction_saves_low_rank_out",
                  "LoRAFunction_merged_forward", "LoRAFunction_ignores_needs", "LoRAFunction_dx_merged",
                  "LoRAFunction_dA_via_dyTx"],
        "right": _LORA_RIGHT,
    },
    "nf4_code": {
        "wrong": ["nf4_code_neg_same_probs", "nf4_code_eight_negative_no_zero"],
        "right": ["nf4_code_ndtri", "nf4_code_statistics"],
    },
    "nf4": {
        "wrong": [
            _nf4("quantize_nf4_low_nibble_first", "dequantize_nf4_low_nibble_first"),
            _nf4("quantize_nf4_ties_up", "ref"),
            _nf4("quantize_nf4_argmin_distance", "ref"),
            _nf4("quantize_nf4_strided_blocks", "dequantize_nf4_strided_blocks"),
            _nf4("quantize_nf4_zero_block_absmax_one", "ref"),
            _nf4("quantize_nf4_zero_block_nan", "ref"),
            _nf4("quantize_nf4_divide_in_input_dtype", "ref"),
            _nf4("quantize_nf4_absmax_input_dtype", "ref"),
            _nf4("quantize_nf4_accepts_any_dtype", "ref"),
            _nf4("quantize_nf4_pads", "dequantize_nf4_crops"),
            _nf4("ref", "dequantize_nf4_fp32_out"),
            _nf4("ref", "dequantize_nf4_multiply_in_dtype"),
        ],
        "right": [
            _nf4("quantize_nf4_bucketize", "dequantize_nf4_index"),
            _nf4("quantize_nf4_count_midpoints", "ref"),
            _nf4("ref", "dequantize_nf4_table"),
        ],
    },
    "fake_step_memory": {
        "wrong": ["fake_step_memory_plain_mode", "fake_step_memory_trainer_outside", "fake_step_memory_outside_allow_real",
                  "fake_step_memory_first_step", "fake_step_memory_two_modes", "fake_step_memory_measure_after_exit"],
        "right": ["fake_step_memory_plain", "fake_step_memory_reenter"],
    },
}

WHY = {
    "lora_state_bytes_no_gqa": "wqkv is d_model -> d_model + 2*kv, kv = n_kv_heads * head_dim (GQA), not 3*d_model",
    "lora_state_bytes_hf_split_w13": "'One adapter per nn.Linear': w13 is one adapter of r(h + 2f), not two of r(h + f)",
    "lora_state_bytes_w13_single_width": "w13 is d_model -> 2 * ffn_hidden (gate and up in one matrix)",
    "lora_state_bytes_head_per_layer": "'each target's adapter in every block; \"head\"'s once'",
    "lora_state_bytes_adapter_base_dtype": "'the adapters' (fp32, ADAPTER_BYTES each)'; grads 'the adapters' only, fp32'",
    "lora_state_bytes_adam_two_times_eight": "'AdamW's two fp32 states ... (ADAM_STATE_BYTES per parameter)': 8, not 16",
    "lora_state_bytes_untied_base": "base is count_params(cfg), which counts a tied head once",
    "lora_state_bytes_tied_head_skipped": "LoRALinear wraps a tied head too (the same weight), with an r(h + V) adapter",
    "lora_state_bytes_float_r": "'Raise ValueError naming the argument for an r that is not a positive int'; 'All values are ints'",
    "lora_state_bytes_dedup_targets": "'Raise ValueError ... targets that are ... repeated'",
    "lora_state_bytes_any_dtype": "'Raise ValueError ... a base_dtype other than fp32, fp16, bf16'",
    "lora_state_bytes_typeerror_r": "'Raise ValueError naming the argument for an r that is not a positive int'",
    "LoRAFunction_dA_no_scale": "dL/dA = s (dy B)^T x",
    "LoRAFunction_dx_base_only": "dL/dx = dy W + s (dy B) A",
    "LoRAFunction_needs_offbyone": "forward's inputs are (x, weight, lora_a, lora_b, scale): lora_a is position 2",
    "LoRAFunction_double_scale": "dL/dB = s dy^T (x A^T): one factor s",
    "LoRAFunction_fp32_out": "'Returns y ... in x's dtype'",
    "LoRAFunction_view_in_backward": "'x ... of any rank >= 1 and any strides'; 'reshape in the backward'",
    "LoRAFunction_no_input_check": "'call the given check_lora_inputs first: it raises ValueError for anything else'",
    "LoRAFunction_saves_contiguous_x": "'no copy of x (not even a contiguous or reshaped one: reshape in the backward)'",
    "LoRAFunction_saves_x_fp32": "'Save for backward only tensors that already exist (x, the weights) and x A^T; no copy of x'",
    "LoRAFunction_saves_low_rank_out": "'Save for backward only tensors that already exist ... and x A^T'",
    "LoRAFunction_merged_forward": "'nothing of W's size in the forward'",
    "LoRAFunction_ignores_needs": "'compute each one only when ctx.needs_input_grad asks for it'",
    "LoRAFunction_dx_merged": "'Nothing of W's size here either' (backward)",
    "LoRAFunction_dA_via_dyTx": "'computing dy^T x would cost a full copy of W'; 'Nothing of W's size here either'",
    "nf4_code_neg_same_probs": "negatives are -Phi^-1 of linspace(δ, 0.5, 8) without 0.5, not of the positives' probabilities",
    "nf4_code_eight_negative_no_zero": "'8 levels above zero and 7 below' and 'An exact zero is one of the levels'",
    "quantize_nf4_low_nibble_first": "'even column 2j in the high nibble of byte j and column 2j + 1 in the low nibble'",
    "quantize_nf4_ties_up": "'a value equal to a midpoint goes to the lower level'",
    "quantize_nf4_argmin_distance": "'Nearest is decided by the midpoints between neighbouring levels, computed in fp32'",
    "quantize_nf4_strided_blocks": "'Per block of 64 consecutive values of a row'",
    "quantize_nf4_zero_block_absmax_one": "'absmax = max |w| in fp32; ... a block of zeros divides by 1' (absmax stays 0)",
    "quantize_nf4_zero_block_nan": "'a block of zeros divides by 1'",
    "quantize_nf4_divide_in_input_dtype": "'each value w / absmax (fp32 ...)'",
    "quantize_nf4_absmax_input_dtype": "'absmax fp32 (d_out, d_in / 64)'",
    "quantize_nf4_accepts_any_dtype": "'ValueError ... for a tensor that is ... not fp32/fp16/bf16'",
    "quantize_nf4_pads": "'d_in a multiple of NF4_BLOCK = 64 (ValueError otherwise ...)'",
    "dequantize_nf4_fp32_out": "'in the dtype of the original weight (q.dtype)'",
    "dequantize_nf4_multiply_in_dtype": "'code[index] x absmax, computed in fp32'",
    "fake_step_memory_plain_mode": "'under memfit.fake.FakeTensors' (some models run the course's Triton kernels)",
    "fake_step_memory_trainer_outside": "'build the trainer with make_trainer() ... under FakeTensorMode'",
    "fake_step_memory_outside_allow_real": "'It must create no real tensor of the model's size'",
    "fake_step_memory_first_step": "'return what measure_step(...) measures there' (a steady-state step)",
    "fake_step_memory_two_modes": "build and measure under the one FakeTensorMode",
    "fake_step_memory_measure_after_exit": "measure_step must run 'there', under FakeTensorMode",
}


# ============================================================================================================
# Exercise 6: plan_fine_tune, most_tokens (check "plan"; written from section 7's text alone)
# ============================================================================================================

import bisect as _bisect  # noqa: E402

from memfit.from_lessons.fine_tune import HEADROOM, PLANS, SEQ_STEP, fake_peak  # noqa: E402


def _plan_args(card_bytes, cfg, seq=None, plan=None, *, float_ok=False, typeerror=False, max_check="strict",
               seq_sign="positive", plan_check=True):
    """ValueError naming the argument (the text's rules), with switches for the mistakes below."""
    def positive_int(name, value, sign="positive"):
        if isinstance(value, bool) or not isinstance(value, int):
            if float_ok and isinstance(value, float):
                pass
            elif typeerror:
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
            else:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if value < 0 or (sign == "positive" and value == 0):
            raise ValueError(f"{name} must be a positive int, not {value!r}")
    positive_int("card_bytes", card_bytes)
    if seq is not None:
        positive_int("seq", seq, seq_sign)
        if max_check == "strict" and seq > cfg.max_seq_len:
            raise ValueError(f"seq={seq} is beyond cfg.max_seq_len={cfg.max_seq_len}")
        if max_check == "off_by_one" and seq >= cfg.max_seq_len:
            raise ValueError(f"seq={seq} must be below cfg.max_seq_len={cfg.max_seq_len}")
    if plan_check and plan is not None and plan not in PLANS:
        raise ValueError(f"plan must be one of {PLANS}, not {plan!r}")


# ---- plan_fine_tune -----------------------------------------------------------------------------------------

def plan_fine_tune_loop(card_bytes, cfg, seq, predict=fake_peak):
    """RIGHT: the plain loop, one prediction per plan tried, stop at the first that fits."""
    _plan_args(card_bytes, cfg, seq=seq)
    budget = HEADROOM * card_bytes
    for plan in PLANS:
        peak = predict(plan, cfg, seq)
        if peak <= budget:
            return {"plan": plan, "peak": peak}
    return None


def plan_fine_tune_next(card_bytes, cfg, seq, predict=fake_peak):
    """RIGHT: a lazy generator and next(); predictions happen only as next() pulls them."""
    _plan_args(card_bytes, cfg, seq=seq)
    peaks = ((plan, predict(plan, cfg, seq)) for plan in PLANS)
    return next(({"plan": plan, "peak": peak} for plan, peak in peaks if peak <= HEADROOM * card_bytes), None)


def plan_fine_tune_strict_less(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: a peak exactly on the budget does not fit."""
    _plan_args(card_bytes, cfg, seq=seq)
    for plan in PLANS:
        peak = predict(plan, cfg, seq)
        if peak < HEADROOM * card_bytes:
            return {"plan": plan, "peak": peak}
    return None


def plan_fine_tune_whole_card(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: the budget is the whole card, no HEADROOM."""
    _plan_args(card_bytes, cfg, seq=seq)
    for plan in PLANS:
        peak = predict(plan, cfg, seq)
        if peak <= card_bytes:
            return {"plan": plan, "peak": peak}
    return None


def plan_fine_tune_headroom_added(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: reads HEADROOM as a margin on the peak: peak / HEADROOM must fit the card (budget 0.9 -> 1/0.9)."""
    _plan_args(card_bytes, cfg, seq=seq)
    for plan in PLANS:
        peak = predict(plan, cfg, seq)
        if peak * (1 + (1 - HEADROOM)) <= card_bytes:
            return {"plan": plan, "peak": peak}
    return None


def plan_fine_tune_predicts_all(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: predicts every plan up front, then picks the first that fits (right answer, too many predictions)."""
    _plan_args(card_bytes, cfg, seq=seq)
    peaks = {plan: predict(plan, cfg, seq) for plan in PLANS}
    for plan in PLANS:
        if peaks[plan] <= HEADROOM * card_bytes:
            return {"plan": plan, "peak": peaks[plan]}
    return None


def plan_fine_tune_smallest_peak(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: the fitting plan with the smallest peak (the 'safest'), not the first in order of preference."""
    _plan_args(card_bytes, cfg, seq=seq)
    fits = [(predict(plan, cfg, seq), plan) for plan in PLANS]
    fits = [(peak, plan) for peak, plan in fits if peak <= HEADROOM * card_bytes]
    if not fits:
        return None
    peak, plan = min(fits)
    return {"plan": plan, "peak": peak}


def plan_fine_tune_no_break(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: forgets to stop: the last plan that fits overwrites the first."""
    _plan_args(card_bytes, cfg, seq=seq)
    choice = None
    for plan in PLANS:
        peak = predict(plan, cfg, seq)
        if peak <= HEADROOM * card_bytes:
            choice = {"plan": plan, "peak": peak}
    return choice


def plan_fine_tune_predict_twice(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: predicts once to test and again to report the peak."""
    _plan_args(card_bytes, cfg, seq=seq)
    for plan in PLANS:
        if predict(plan, cfg, seq) <= HEADROOM * card_bytes:
            return {"plan": plan, "peak": predict(plan, cfg, seq)}
    return None


def plan_fine_tune_returns_name(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: returns the plan's name only."""
    _plan_args(card_bytes, cfg, seq=seq)
    for plan in PLANS:
        if predict(plan, cfg, seq) <= HEADROOM * card_bytes:
            return plan
    return None


def plan_fine_tune_budget_as_peak(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: reports the budget it fits under as "peak", not the predicted bytes."""
    _plan_args(card_bytes, cfg, seq=seq)
    budget = HEADROOM * card_bytes
    for plan in PLANS:
        if predict(plan, cfg, seq) <= budget:
            return {"plan": plan, "peak": int(budget)}
    return None


def plan_fine_tune_empty_when_none(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: {"plan": None, "peak": None} when nothing fits, not None."""
    _plan_args(card_bytes, cfg, seq=seq)
    for plan in PLANS:
        peak = predict(plan, cfg, seq)
        if peak <= HEADROOM * card_bytes:
            return {"plan": plan, "peak": peak}
    return {"plan": None, "peak": None}


def plan_fine_tune_reversed(card_bytes, cfg, seq, predict=fake_peak):
    """WRONG: walks PLANS from the leanest (QLoRA + recomputation) up and keeps the richest that still fits."""
    _plan_args(card_bytes, cfg, seq=seq)
    choice = None
    for plan in reversed(PLANS):
        peak = predict(plan, cfg, seq)
        if peak > HEADROOM * card_bytes:
            break
        choice = {"plan": plan, "peak": peak}
    return choice


def _plan_with(**switches):
    def plan_fine_tune(card_bytes, cfg, seq, predict=fake_peak):
        _plan_args(card_bytes, cfg, seq=seq, **switches)
        for plan in PLANS:
            peak = predict(plan, cfg, seq)
            if peak <= HEADROOM * card_bytes:
                return {"plan": plan, "peak": peak}
        return None
    return plan_fine_tune


plan_fine_tune_float_card = _plan_with(float_ok=True)
plan_fine_tune_float_card.__doc__ = "WRONG: accepts a float card_bytes (80e9) and a float seq."
plan_fine_tune_typeerror = _plan_with(typeerror=True)
plan_fine_tune_typeerror.__doc__ = "WRONG: TypeError, not ValueError, for a card_bytes or seq that is not an int."
plan_fine_tune_no_max_check = _plan_with(max_check="none")
plan_fine_tune_no_max_check.__doc__ = "WRONG: a seq beyond cfg.max_seq_len is predicted, not refused."
plan_fine_tune_max_off_by_one = _plan_with(max_check="off_by_one")
plan_fine_tune_max_off_by_one.__doc__ = "WRONG: refuses seq == cfg.max_seq_len too."
plan_fine_tune_seq_zero_ok = _plan_with(seq_sign="nonnegative")
plan_fine_tune_seq_zero_ok.__doc__ = "WRONG: seq = 0 accepted (only negatives refused)."


# ---- most_tokens --------------------------------------------------------------------------------------------

def most_tokens_bisect(card_bytes, cfg, plan, predict=fake_peak):
    """RIGHT: bisection over k = 1 .. max_seq_len // 256 with lo always fitting (0: nothing)."""
    _plan_args(card_bytes, cfg, plan=plan)
    budget = HEADROOM * card_bytes
    lo, hi = 0, cfg.max_seq_len // SEQ_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(plan, cfg, mid * SEQ_STEP) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * SEQ_STEP


def most_tokens_bisect_key(card_bytes, cfg, plan, predict=fake_peak):
    """RIGHT: the standard library's bisect with a key (a fit is False, a miss True: the first miss's index)."""
    _plan_args(card_bytes, cfg, plan=plan)
    steps = range(1, cfg.max_seq_len // SEQ_STEP + 1)
    misses = _bisect.bisect_left(steps, True, key=lambda k: predict(plan, cfg, k * SEQ_STEP) > HEADROOM * card_bytes)
    return misses * SEQ_STEP


def most_tokens_ends_first(card_bytes, cfg, plan, predict=fake_peak):
    """RIGHT: tries 256 (0 if it misses) and the longest (done if it fits) first, then bisects between them:
    two predictions more, still O(log)."""
    _plan_args(card_bytes, cfg, plan=plan)
    budget = HEADROOM * card_bytes
    n = cfg.max_seq_len // SEQ_STEP
    if n == 0 or predict(plan, cfg, SEQ_STEP) > budget:
        return 0
    if predict(plan, cfg, n * SEQ_STEP) <= budget:
        return n * SEQ_STEP
    lo, hi = 1, n  # lo fits, hi misses
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if predict(plan, cfg, mid * SEQ_STEP) <= budget:
            lo = mid
        else:
            hi = mid
    return lo * SEQ_STEP


def most_tokens_linear(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: tries every length from 256 up until one misses."""
    _plan_args(card_bytes, cfg, plan=plan)
    best = 0
    for seq in range(SEQ_STEP, cfg.max_seq_len + 1, SEQ_STEP):
        if predict(plan, cfg, seq) > HEADROOM * card_bytes:
            break
        best = seq
    return best


def most_tokens_linear_down(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: tries every length from the longest down until one fits."""
    _plan_args(card_bytes, cfg, plan=plan)
    for seq in range(cfg.max_seq_len // SEQ_STEP * SEQ_STEP, 0, -SEQ_STEP):
        if predict(plan, cfg, seq) <= HEADROOM * card_bytes:
            return seq
    return 0


def _most_with(*, strict=False, whole_card=False, hi_round=None, plan_check=True):
    def most_tokens(card_bytes, cfg, plan, predict=fake_peak):
        _plan_args(card_bytes, cfg, plan=plan, plan_check=plan_check)
        budget = card_bytes if whole_card else HEADROOM * card_bytes
        fits = (lambda p: p < budget) if strict else (lambda p: p <= budget)
        n = cfg.max_seq_len // SEQ_STEP
        if hi_round == "ceil":
            n = -(-cfg.max_seq_len // SEQ_STEP)
        elif hi_round == "nearest":
            n = round(cfg.max_seq_len / SEQ_STEP)
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(predict(plan, cfg, mid * SEQ_STEP)):
                lo = mid
            else:
                hi = mid - 1
        return lo * SEQ_STEP
    return most_tokens


most_tokens_strict_less = _most_with(strict=True)
most_tokens_strict_less.__doc__ = "WRONG: a length whose peak is exactly on the budget does not fit."
most_tokens_whole_card = _most_with(whole_card=True)
most_tokens_whole_card.__doc__ = "WRONG: the budget is the whole card, no HEADROOM."
most_tokens_ceil_max = _most_with(hi_round="ceil")
most_tokens_ceil_max.__doc__ = "WRONG: rounds max_seq_len up to a multiple of 256 (answers beyond cfg.max_seq_len)."
most_tokens_nearest_max = _most_with(hi_round="nearest")
most_tokens_nearest_max.__doc__ = "WRONG: rounds max_seq_len to the nearest multiple of 256."
most_tokens_no_plan_check = _most_with(plan_check=False)
most_tokens_no_plan_check.__doc__ = "WRONG: a plan not in PLANS goes to predict unchecked."


def most_tokens_returns_max_len(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: tries cfg.max_seq_len itself first and returns it when it fits (not a multiple of 256)."""
    _plan_args(card_bytes, cfg, plan=plan)
    budget = HEADROOM * card_bytes
    if predict(plan, cfg, cfg.max_seq_len) <= budget:
        return cfg.max_seq_len
    lo, hi = 0, cfg.max_seq_len // SEQ_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(plan, cfg, mid * SEQ_STEP) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * SEQ_STEP


def most_tokens_never_top(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: the classic lo = mid + 1 bisection that never tests the longest length (one step short when it fits)."""
    _plan_args(card_bytes, cfg, plan=plan)
    budget = HEADROOM * card_bytes
    lo, hi = 1, cfg.max_seq_len // SEQ_STEP
    while lo < hi:
        mid = (lo + hi) // 2
        if predict(plan, cfg, mid * SEQ_STEP) <= budget:
            lo = mid + 1
        else:
            hi = mid
    return (lo - 1) * SEQ_STEP


def most_tokens_at_least_256(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: assumes the shortest length fits: 256 when nothing does, never 0."""
    _plan_args(card_bytes, cfg, plan=plan)
    budget = HEADROOM * card_bytes
    lo, hi = 1, cfg.max_seq_len // SEQ_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(plan, cfg, mid * SEQ_STEP) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * SEQ_STEP


def most_tokens_token_bisect(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: bisects over every token count 1 .. max_seq_len and rounds the answer down to 256: predicts lengths
    that are no multiple of SEQ_STEP and takes log2(256) = 8 predictions more."""
    _plan_args(card_bytes, cfg, plan=plan)
    budget = HEADROOM * card_bytes
    lo, hi = 0, cfg.max_seq_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(plan, cfg, mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo // SEQ_STEP * SEQ_STEP


def most_tokens_float_card(card_bytes, cfg, plan, predict=fake_peak):
    """WRONG: accepts a float card_bytes."""
    _plan_args(card_bytes, cfg, plan=plan, float_ok=True)
    return most_tokens_bisect(int(card_bytes) if isinstance(card_bytes, float) else card_bytes, cfg, plan, predict)


def _plan_entry(p, m):
    return {"plan_fine_tune": p, "most_tokens": m}


BLIND["plan"] = {
    "wrong": [
        _plan_entry("plan_fine_tune_strict_less", "ref"),
        _plan_entry("plan_fine_tune_whole_card", "ref"),
        _plan_entry("plan_fine_tune_headroom_added", "ref"),
        _plan_entry("plan_fine_tune_predicts_all", "ref"),
        _plan_entry("plan_fine_tune_smallest_peak", "ref"),
        _plan_entry("plan_fine_tune_no_break", "ref"),
        _plan_entry("plan_fine_tune_predict_twice", "ref"),
        _plan_entry("plan_fine_tune_returns_name", "ref"),
        _plan_entry("plan_fine_tune_budget_as_peak", "ref"),
        _plan_entry("plan_fine_tune_empty_when_none", "ref"),
        _plan_entry("plan_fine_tune_reversed", "ref"),
        _plan_entry("plan_fine_tune_float_card", "ref"),
        _plan_entry("plan_fine_tune_typeerror", "ref"),
        _plan_entry("plan_fine_tune_no_max_check", "ref"),
        _plan_entry("plan_fine_tune_max_off_by_one", "ref"),
        _plan_entry("plan_fine_tune_seq_zero_ok", "ref"),
        _plan_entry("ref", "most_tokens_linear"),
        _plan_entry("ref", "most_tokens_linear_down"),
        _plan_entry("ref", "most_tokens_strict_less"),
        _plan_entry("ref", "most_tokens_whole_card"),
        _plan_entry("ref", "most_tokens_ceil_max"),
        _plan_entry("ref", "most_tokens_nearest_max"),
        _plan_entry("ref", "most_tokens_no_plan_check"),
        _plan_entry("ref", "most_tokens_returns_max_len"),
        _plan_entry("ref", "most_tokens_never_top"),
        _plan_entry("ref", "most_tokens_at_least_256"),
        _plan_entry("ref", "most_tokens_token_bisect"),
        _plan_entry("ref", "most_tokens_float_card"),
    ],
    "right": [
        _plan_entry("plan_fine_tune_loop", "most_tokens_bisect"),
        _plan_entry("plan_fine_tune_next", "ref"),
        _plan_entry("ref", "most_tokens_bisect_key"),
        _plan_entry("ref", "most_tokens_ends_first"),
    ],
}

WHY.update({
    "plan_fine_tune_strict_less": "'whose predict(plan, cfg, seq) is at most HEADROOM * card_bytes'",
    "plan_fine_tune_whole_card": "'at most HEADROOM * card_bytes'",
    "plan_fine_tune_headroom_added": "'at most HEADROOM * card_bytes' (HEADROOM is the share usable, not a margin)",
    "plan_fine_tune_predicts_all": "'Call predict only as often as needed (plans are tried in order ...)'",
    "plan_fine_tune_smallest_peak": "'the first plan of PLANS' (in the order of preference)",
    "plan_fine_tune_no_break": "'the first plan of PLANS whose ... is at most ...'",
    "plan_fine_tune_predict_twice": "'Call predict only as often as needed'",
    "plan_fine_tune_returns_name": "'as {\"plan\": name, \"peak\": predicted bytes}'",
    "plan_fine_tune_budget_as_peak": "'\"peak\": predicted bytes'",
    "plan_fine_tune_empty_when_none": "'or None when none fits'",
    "plan_fine_tune_reversed": "'the first plan of PLANS' (order of preference, full fine-tune first)",
    "plan_fine_tune_float_card": "'raise ValueError naming the argument for a card_bytes or seq that is not a "
                                 "positive int'",
    "plan_fine_tune_typeerror": "'raise ValueError naming the argument for a card_bytes or seq that is not a "
                                "positive int'",
    "plan_fine_tune_no_max_check": "'raise ValueError ... a seq beyond cfg.max_seq_len'",
    "plan_fine_tune_max_off_by_one": "'a seq beyond cfg.max_seq_len' (seq == max_seq_len is allowed)",
    "plan_fine_tune_seq_zero_ok": "'a card_bytes or seq that is not a positive int'",
    "most_tokens_linear": "'search by bisection, in O(log(max_seq_len / 256)) predictions, not by trying every length'",
    "most_tokens_linear_down": "'search by bisection, ... not by trying every length'",
    "most_tokens_strict_less": "'whose predicted peak fits the same budget' (at most HEADROOM * card_bytes)",
    "most_tokens_whole_card": "'fits the same budget' (HEADROOM * card_bytes)",
    "most_tokens_ceil_max": "'a multiple of SEQ_STEP = 256 and at most cfg.max_seq_len'",
    "most_tokens_nearest_max": "'a multiple of SEQ_STEP = 256 and at most cfg.max_seq_len'",
    "most_tokens_no_plan_check": "'Both raise ValueError naming the argument for ... a plan not in PLANS'",
    "most_tokens_returns_max_len": "'the largest sequence length, a multiple of SEQ_STEP = 256'",
    "most_tokens_never_top": "'the largest sequence length ... at most cfg.max_seq_len' (the longest is a candidate)",
    "most_tokens_at_least_256": "'(0 when not even 256 does)'",
    "most_tokens_token_bisect": "'a multiple of SEQ_STEP', 'in O(log(max_seq_len / 256)) predictions' (borderline)",
    "most_tokens_float_card": "'Both raise ValueError naming the argument for a card_bytes ... that is not a "
                              "positive int'",
})
