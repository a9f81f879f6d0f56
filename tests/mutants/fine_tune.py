"""Known-wrong (and known-right alternative) implementations of lesson 08's exercises."""
import torch

import memfit.from_lessons.fine_tune as ref
from memfit.from_lessons.fine_tune import check_lora_inputs, nf4_code as reference_code
from memfit.from_lessons.model_states import count_params


# ------------------------------------------------------------------------------------------ lora_state_bytes
def _lora_bytes(cfg, r, targets, base_dtype, shapes=None, adapter_bytes=4, state_bytes=8, base_count=None,
                validate=True):
    if validate:
        ref.lora_state_bytes(cfg, r, targets, base_dtype)  # the reference's ValueErrors
    h, f, kv = cfg.d_model, cfg.ffn_hidden, cfg.n_kv_heads * cfg.head_dim
    shapes = shapes or {"wqkv": (h, h + 2 * kv), "wo": (h, h), "w13": (h, 2 * f), "w2": (f, h)}
    trainable = cfg.n_layers * sum(r * sum(shapes[t]) for t in targets if t in shapes)
    if "head" in targets:
        trainable += r * (h + cfg.vocab_size)
    base = (base_count or count_params(cfg)) * torch.empty((), dtype=base_dtype).element_size()
    return {"trainable": trainable, "params": base + adapter_bytes * trainable, "grads": adapter_bytes * trainable,
            "optimizer": state_bytes * trainable}


def lora_bytes_unfused_gate_up(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    """Hugging Face's Llama: gate and up are two matrices, two adapters."""
    h, f, kv = cfg.d_model, cfg.ffn_hidden, cfg.n_kv_heads * cfg.head_dim
    return _lora_bytes(cfg, r, targets, base_dtype,
                       {"wqkv": (h, h + 2 * kv), "wo": (h, h), "w13": (2 * h, 2 * f), "w2": (f, h)})


def lora_bytes_adapters_in_base_dtype(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    e = torch.empty((), dtype=base_dtype).element_size()
    return _lora_bytes(cfg, r, targets, base_dtype, adapter_bytes=e)


def lora_bytes_ignores_gqa(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    h, f = cfg.d_model, cfg.ffn_hidden
    return _lora_bytes(cfg, r, targets, base_dtype, {"wqkv": (h, 3 * h), "wo": (h, h), "w13": (h, 2 * f), "w2": (f, h)})


def lora_bytes_grads_for_every_parameter(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    out = _lora_bytes(cfg, r, targets, base_dtype)
    return {**out, "grads": out["grads"] + count_params(cfg) * torch.empty((), dtype=base_dtype).element_size()}


def lora_bytes_adam_with_master(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    return _lora_bytes(cfg, r, targets, base_dtype, state_bytes=12)


def lora_bytes_head_in_every_block(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    out = _lora_bytes(cfg, r, [t for t in targets if t != "head"], base_dtype)
    extra = cfg.n_layers * r * (cfg.d_model + cfg.vocab_size) if "head" in targets else 0
    return {"trainable": out["trainable"] + extra, "params": out["params"] + 4 * extra,
            "grads": out["grads"] + 4 * extra, "optimizer": out["optimizer"] + 8 * extra}


def lora_bytes_no_validation(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):
    targets = [t for t in dict.fromkeys(targets) if t in ref.LORA_TARGETS] or list(ref.DEFAULT_TARGETS)
    dtype = base_dtype if base_dtype in ref.BASE_DTYPES else torch.bfloat16
    return _lora_bytes(cfg, max(1, int(r)), targets, dtype, validate=False)


def lora_bytes_by_building(cfg, r, targets=ref.DEFAULT_TARGETS, base_dtype=torch.bfloat16):  # right
    ref.lora_state_bytes(cfg, r, targets, base_dtype)
    from memfit.gpt import GPT, unique_parameters
    small = cfg.scaled(n_layers=1), cfg.scaled(n_layers=2)
    counts = []
    for c in small:
        with torch.device("meta"):
            params = unique_parameters(ref.add_lora(GPT(c), r, 1.0, targets))
        counts.append((sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)))
    trainable = counts[0][0] + (cfg.n_layers - 1) * (counts[1][0] - counts[0][0])
    total = counts[0][1] + (cfg.n_layers - 1) * (counts[1][1] - counts[0][1])
    e = torch.empty((), dtype=base_dtype).element_size()
    return {"trainable": trainable, "params": (total - trainable) * e + 4 * trainable, "grads": 4 * trainable,
            "optimizer": 8 * trainable}


# ------------------------------------------------------------------------------------------ LoRAFunction
class LoRAReference(ref.LoRAFunction):
    pass


def _lora_class(name, forward=None, backward=None):
    attrs = {}
    if forward:
        attrs["forward"] = staticmethod(forward)
    if backward:
        attrs["backward"] = staticmethod(backward)
    return type(name, (ref.LoRAFunction,), attrs)


def _backward(ctx, dy, scale_b=None, scale_a=None, dx_lora=True, always_dx=False, dw=False):
    x, weight, lora_a, lora_b, xa = ctx.saved_tensors
    s, r = ctx.scale, lora_a.shape[0]
    dyb = dy @ lora_b
    dx = None
    if ctx.needs_input_grad[0] or always_dx:
        dx = dy @ weight
        if dx_lora:
            dx = dx + s * (dyb @ lora_a)
    if dw:
        (dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])).sum()  # dW, computed and dropped
    d_a = (dyb.reshape(-1, r).t() @ x.reshape(-1, x.shape[-1])) * (s if scale_a is None else scale_a(s))
    d_b = (dy.reshape(-1, dy.shape[-1]).t() @ xa.reshape(-1, r)) * (s if scale_b is None else scale_b(s))
    return (dx if ctx.needs_input_grad[0] else None), None, d_a, d_b, None


LoRANoScaleInBackward = _lora_class("LoRANoScaleInBackward", backward=lambda ctx, dy: _backward(
    ctx, dy, scale_b=lambda s: 1.0, scale_a=lambda s: 1.0))
LoRAScaleSquaredInDB = _lora_class("LoRAScaleSquaredInDB", backward=lambda ctx, dy: _backward(
    ctx, dy, scale_b=lambda s: s * s))
LoRADxWithoutAdapter = _lora_class("LoRADxWithoutAdapter", backward=lambda ctx, dy: _backward(ctx, dy, dx_lora=False))
LoRAAlwaysComputesDx = _lora_class("LoRAAlwaysComputesDx", backward=lambda ctx, dy: _backward(ctx, dy, always_dx=True))
LoRAComputesDW = _lora_class("LoRAComputesDW", backward=lambda ctx, dy: _backward(ctx, dy, dw=True))


def _forward_flat_view(ctx, x, weight, lora_a, lora_b, scale):  # x.view: fails on a strided x
    check_lora_inputs(x, weight, lora_a, lora_b)
    x2 = x.view(-1, x.shape[-1])
    xa = x2 @ lora_a.t()
    y = (x2 @ weight.t() + scale * (xa @ lora_b.t())).view(*x.shape[:-1], -1)
    ctx.save_for_backward(x, weight, lora_a, lora_b, xa.view(*x.shape[:-1], -1))
    ctx.scale = scale
    return y


def _forward_saves_copy(ctx, x, weight, lora_a, lora_b, scale):  # saves a contiguous 2-D copy of x
    check_lora_inputs(x, weight, lora_a, lora_b)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    xa = x2 @ lora_a.t()
    y = x2 @ weight.t()
    y.add_(xa @ lora_b.t(), alpha=scale)
    ctx.save_for_backward(x2.view_as(x) if x.is_contiguous() else x2, weight, lora_a, lora_b, xa)
    ctx.x_shape, ctx.scale = x.shape, scale
    return y.view(*x.shape[:-1], -1)


def _backward_from_copy(ctx, dy):
    x2, weight, lora_a, lora_b, xa = ctx.saved_tensors
    s = ctx.scale
    dy2 = dy.reshape(-1, dy.shape[-1])
    dyb = dy2 @ lora_b
    dx = (dy2 @ weight + s * (dyb @ lora_a)).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
    return dx, None, s * dyb.t() @ x2.reshape(-1, x2.shape[-1]), s * dy2.t() @ xa, None


def _forward_merged(ctx, x, weight, lora_a, lora_b, scale):  # W + s·B A: a tensor of W's size
    check_lora_inputs(x, weight, lora_a, lora_b)
    merged = weight + scale * (lora_b @ lora_a)
    xa = x @ lora_a.t()
    ctx.save_for_backward(x, weight, lora_a, lora_b, xa)
    ctx.scale = scale
    return x @ merged.t()


def _forward_no_validation(ctx, x, weight, lora_a, lora_b, scale):
    xa = x @ lora_a.t()
    y = x @ weight.t() + scale * (xa @ lora_b.t())
    ctx.save_for_backward(x, weight, lora_a, lora_b, xa)
    ctx.scale = scale
    return y


LoRAFlatView = _lora_class("LoRAFlatView", forward=_forward_flat_view)
LoRASavesCopy = _lora_class("LoRASavesCopy", forward=_forward_saves_copy, backward=_backward_from_copy)
LoRAMergedWeight = _lora_class("LoRAMergedWeight", forward=_forward_merged)
LoRANoValidation = _lora_class("LoRANoValidation", forward=_forward_no_validation)


def _forward_einsum(ctx, x, weight, lora_a, lora_b, scale):  # right: einsum, the low-rank product scaled first
    check_lora_inputs(x, weight, lora_a, lora_b)
    xa = torch.einsum("...i,ri->...r", x, lora_a)
    y = torch.einsum("...i,oi->...o", x, weight) + torch.einsum("...r,or->...o", xa * scale, lora_b)
    ctx.save_for_backward(x, weight, lora_a, lora_b, xa)
    ctx.scale = scale
    return y


def _backward_einsum(ctx, dy):
    x, weight, lora_a, lora_b, xa = ctx.saved_tensors
    s = ctx.scale
    dyb = torch.einsum("...o,or->...r", dy, lora_b)
    dx = (torch.einsum("...o,oi->...i", dy, weight) + s * torch.einsum("...r,ri->...i", dyb, lora_a)
          if ctx.needs_input_grad[0] else None)
    d_a = s * torch.einsum("...r,...i->ri", dyb, x)
    d_b = s * torch.einsum("...o,...r->or", dy, xa)
    return dx, None, d_a, d_b, None


LoRAEinsum = _lora_class("LoRAEinsum", forward=_forward_einsum, backward=_backward_einsum)


# ------------------------------------------------------------------------------------------ nf4_code
def _quantile_code(pos_points, neg_points, offset=ref.NF4_OFFSET, dtype=torch.float64, zero=True):
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, pos_points + 1, dtype=dtype)[:-1].double())
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, neg_points + 1, dtype=dtype)[:-1].double())
    levels = torch.cat([neg] + ([torch.zeros(1, dtype=torch.float64)] if zero else []) + [pos]).sort().values
    return (levels / levels.abs().max()).float()


def nf4_code_symmetric():  # 8 and 8, no zero
    return _quantile_code(8, 8, zero=False)


def nf4_code_offset_099():
    return _quantile_code(8, 7, offset=0.99)


def nf4_code_float64():
    return _quantile_code(8, 7).double()


def nf4_code_not_normalized():
    pos = torch.special.ndtri(torch.linspace(ref.NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -torch.special.ndtri(torch.linspace(ref.NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1])
    return torch.cat([neg, torch.zeros(1, dtype=torch.float64), pos]).sort().values.float()


def nf4_code_fp32_probabilities():  # right: bitsandbytes' way (fp32 linspace), the quantiles in float64
    return _quantile_code(8, 7, dtype=torch.float32)


# ------------------------------------------------------------------------------------------ nf4
def _quantize(w, right=False, swap=False, absmax_fn=None, guard_zero=True, midpoints=None):
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in ref.BASE_DTYPES or w.shape[1] % 64:
        raise ValueError("w must be 2-D fp32/fp16/bf16 with a multiple of 64 columns")
    d_out, d_in = w.shape
    blocks = w.float().reshape(d_out, d_in // 64, 64)
    absmax = blocks.abs().amax(dim=-1) if absmax_fn is None else absmax_fn(blocks)
    scaled = blocks / (torch.where(absmax > 0, absmax, 1.0) if guard_zero else absmax)[..., None]
    code = reference_code().to(w.device)
    mids = (code[1:] + code[:-1]) / 2 if midpoints is None else midpoints(code)
    index = torch.bucketize(scaled.contiguous(), mids, right=right).clamp(0, 15).to(torch.uint8).reshape(d_out, d_in)
    hi, lo = index[:, 0::2], index[:, 1::2]
    codes = (lo << 4) | hi if swap else (hi << 4) | lo
    return ref.NF4(codes, absmax, tuple(w.shape), w.dtype)


def nf4_quantize_swapped_nibbles(w):
    return _quantize(w, swap=True)


def nf4_quantize_ties_up(w):
    return _quantize(w, right=True)


def nf4_quantize_signed_max(w):  # the block's largest value, not its largest magnitude
    return _quantize(w, absmax_fn=lambda blocks: blocks.amax(dim=-1))


def nf4_quantize_zero_block_nan(w):
    return _quantize(w, guard_zero=False)


def nf4_quantize_midpoints_in_float64(w):  # midpoints not rounded to fp32 first
    return _quantize(w, midpoints=lambda c: ((c[1:].double() + c[:-1].double()) / 2))


def nf4_quantize_blocks_down_columns(w):  # blocks of 64 taken down the columns (the transposed order)
    q = _quantize(w.t().contiguous().reshape(w.shape))
    return ref.NF4(q.codes, q.absmax, tuple(w.shape), w.dtype)


def nf4_quantize_pads_ragged(w):  # no ValueError for a ragged last dimension: pads with zeros
    if isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype in ref.BASE_DTYPES and w.shape[1] % 64:
        w = torch.nn.functional.pad(w, (0, (-w.shape[1]) % 64))
    return _quantize(w)


def nf4_dequantize(q):
    return ref.dequantize_nf4(q)


def nf4_dequantize_in_w_dtype(q):  # level and absmax rounded to the weight's dtype before the product
    d_out, d_in = q.shape
    index = torch.stack([q.codes >> 4, q.codes & 15], dim=-1).reshape(d_out, d_in).long()
    levels = reference_code().to(q.codes.device).to(q.dtype)[index].reshape(d_out, d_in // 64, 64)
    return (levels * q.absmax.to(q.dtype)[..., None]).reshape(d_out, d_in)


def nf4_dequantize_swapped_nibbles(q):
    d_out, d_in = q.shape
    index = torch.stack([q.codes & 15, q.codes >> 4], dim=-1).reshape(d_out, d_in).long()
    values = reference_code().to(q.codes.device)[index].reshape(d_out, d_in // 64, 64)
    return (values * q.absmax[..., None]).reshape(d_out, d_in).to(q.dtype)


def nf4_quantize_by_distance(w):  # right: the nearest level by |x - level|, ties to the lower one
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in ref.BASE_DTYPES or w.shape[1] % 64:
        raise ValueError("w must be 2-D fp32/fp16/bf16 with a multiple of 64 columns")
    d_out, d_in = w.shape
    blocks = w.float().reshape(d_out, d_in // 64, 64)
    absmax = blocks.abs().amax(dim=-1)
    scaled = blocks / torch.where(absmax > 0, absmax, 1.0)[..., None]
    code = reference_code().to(w.device)
    mids = (code[1:] + code[:-1]) / 2
    index = (scaled[..., None] > mids).sum(-1).to(torch.uint8).reshape(d_out, d_in)
    return ref.NF4((index[:, 0::2] << 4) | index[:, 1::2], absmax, tuple(w.shape), w.dtype)


def nf4_dequantize_by_table(q):  # right: a 256-entry table of byte -> two levels
    code = reference_code().to(q.codes.device)
    table = torch.stack([code.repeat_interleave(16), code.repeat(16)], dim=-1)  # byte b -> (code[b >> 4], code[b & 15])
    d_out, d_in = q.shape
    values = table[q.codes.long()].reshape(d_out, d_in // 64, 64)
    return (values * q.absmax[..., None]).reshape(d_out, d_in).to(q.dtype)


# ------------------------------------------------------------------------------------------ fake_step_memory
def fake_step_real_tensors(make_trainer, batch, seq):  # no fake tensors at all
    from memfit.meter import LIVE_TENSORS
    from memfit.training import measure_step
    return measure_step(make_trainer(), batch, seq, meter=LIVE_TENSORS)


def fake_step_trainer_outside(make_trainer, batch, seq):  # the model built for real, only the step faked
    from torch._subclasses.fake_tensor import FakeTensorMode
    from memfit.meter import LIVE_TENSORS
    from memfit.training import measure_step
    trainer = make_trainer()
    with FakeTensorMode(allow_non_fake_inputs=True):
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_trainer_built_before_fake_tensors(make_trainer, batch, seq):  # the course's mode, entered too late
    from memfit.fake import FakeTensors
    from memfit.meter import LIVE_TENSORS
    from memfit.training import measure_step
    trainer = make_trainer()
    with FakeTensors():
        return measure_step(trainer, batch, seq, meter=LIVE_TENSORS)


def fake_step_first_step(make_trainer, batch, seq):  # the first step: no optimizer states yet
    from torch._subclasses.fake_tensor import FakeTensorMode
    from memfit.meter import measure_peak
    from memfit.training import StepMemory, random_batch
    with FakeTensorMode():
        trainer = make_trainer()
        idx, targets = random_batch(trainer.cfg, batch, seq, trainer.device)
        states = trainer.state_bytes()
        _, report = measure_peak(trainer.step, idx, targets, device=trainer.device, meter="live-tensors", warmup=False)
        return StepMemory(sum(states.values()) + report.peak_bytes, states, report.peak_bytes, report.meter)


def fake_step_forward_only(make_trainer, batch, seq):  # the forward's peak, not the step's
    from torch._subclasses.fake_tensor import FakeTensorMode
    from memfit.meter import measure_peak
    from memfit.training import StepMemory, measure_step, random_batch
    with FakeTensorMode():
        trainer = make_trainer()
        full = measure_step(trainer, batch, seq, meter="live-tensors")
        idx, targets = random_batch(trainer.cfg, batch, seq, trainer.device)
        _, report = measure_peak(lambda: trainer.model(idx, targets), meter="live-tensors", device=trainer.device,
                                 warmup=False)
        return StepMemory(sum(full.states.values()) + report.peak_bytes, full.states, report.peak_bytes, report.meter)


def fake_step_plain_mode(make_trainer, batch, seq):  # PyTorch's FakeTensorMode: Triton launches on fake tensors
    from torch._subclasses.fake_tensor import FakeTensorMode
    from memfit.meter import LIVE_TENSORS
    from memfit.training import measure_step
    with FakeTensorMode():
        return measure_step(make_trainer(), batch, seq, meter=LIVE_TENSORS)


def fake_step_meta_device(make_trainer, batch, seq):  # right: the same step, its result copied field by field
    from memfit.fake import FakeTensors
    from memfit.meter import LIVE_TENSORS
    from memfit.training import StepMemory, measure_step
    with FakeTensors() as mode:
        step = measure_step(make_trainer(), batch, seq, meter=LIVE_TENSORS)
    del mode
    return StepMemory(int(step.peak), dict(step.states), int(step.extra), step.meter)



# ------------------------------------------------------------------------------------------ plan
def _budget(card_bytes):
    return ref.HEADROOM * card_bytes


def plan_smallest_peak(card_bytes, cfg, seq, predict=None):  # the smallest peak that fits, not the preferred plan
    ref.check_plan_args(card_bytes, cfg, seq=seq)
    peaks = {p: predict(p, cfg, seq) for p in ref.PLANS}
    fitting = [p for p in ref.PLANS if peaks[p] <= _budget(card_bytes)]
    best = min(fitting, key=peaks.get, default=None)
    return {"plan": best, "peak": peaks[best]} if best else None


def plan_strictly_below(card_bytes, cfg, seq, predict=None):  # a peak equal to the budget does not fit
    ref.check_plan_args(card_bytes, cfg, seq=seq)
    for plan in ref.PLANS:
        peak = predict(plan, cfg, seq)
        if peak < _budget(card_bytes):
            return {"plan": plan, "peak": peak}
    return None


def plan_no_headroom(card_bytes, cfg, seq, predict=None):  # the whole card
    ref.check_plan_args(card_bytes, cfg, seq=seq)
    for plan in ref.PLANS:
        peak = predict(plan, cfg, seq)
        if peak <= card_bytes:
            return {"plan": plan, "peak": peak}
    return None


def plan_predicts_every_plan(card_bytes, cfg, seq, predict=None):  # right answer, every plan predicted first
    ref.check_plan_args(card_bytes, cfg, seq=seq)
    peaks = [(plan, predict(plan, cfg, seq)) for plan in ref.PLANS]
    return next(({"plan": p, "peak": peak} for p, peak in peaks if peak <= _budget(card_bytes)), None)


def plan_returns_name(card_bytes, cfg, seq, predict=None):
    got = ref.plan_fine_tune(card_bytes, cfg, seq, predict)
    return got["plan"] if got else None


def plan_no_validation(card_bytes, cfg, seq, predict=None):
    for plan in ref.PLANS:
        peak = predict(plan, cfg, seq)
        if peak <= _budget(card_bytes):
            return {"plan": plan, "peak": peak}
    return None


def plan_with_next(card_bytes, cfg, seq, predict=None):  # right: a generator, stopped at the first fit
    ref.check_plan_args(card_bytes, cfg, seq=seq)
    tried = ((plan, predict(plan, cfg, seq)) for plan in ref.PLANS)
    return next(({"plan": p, "peak": peak} for p, peak in tried if peak <= _budget(card_bytes)), None)


def tokens_every_length(card_bytes, cfg, plan, predict=None):  # right answers, one prediction per length
    ref.check_plan_args(card_bytes, cfg, plan=plan)
    best = 0
    for seq in range(ref.SEQ_STEP, cfg.max_seq_len + 1, ref.SEQ_STEP):
        if predict(plan, cfg, seq) <= _budget(card_bytes):
            best = seq
    return best


def tokens_powers_of_two(card_bytes, cfg, plan, predict=None):  # doubling only
    ref.check_plan_args(card_bytes, cfg, plan=plan)
    best, seq = 0, ref.SEQ_STEP
    while seq <= cfg.max_seq_len and predict(plan, cfg, seq) <= _budget(card_bytes):
        best, seq = seq, 2 * seq
    return best


def tokens_fixed_ceiling(card_bytes, cfg, plan, predict=None):  # Llama's 131,072, whatever the model's limit
    return ref.most_tokens(card_bytes, cfg.scaled(max_seq_len=131_072), plan, predict)


def tokens_first_that_fails(card_bytes, cfg, plan, predict=None):  # the bisection's other end
    ref.check_plan_args(card_bytes, cfg, plan=plan)
    lo, hi = 0, cfg.max_seq_len // ref.SEQ_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(plan, cfg, mid * ref.SEQ_STEP) <= _budget(card_bytes):
            lo = mid
        else:
            hi = mid - 1
    return min(lo + 1, cfg.max_seq_len // ref.SEQ_STEP) * ref.SEQ_STEP if lo else 0


def tokens_lower_mid(card_bytes, cfg, plan, predict=None):  # right: a bisection on the first length that fails
    ref.check_plan_args(card_bytes, cfg, plan=plan)
    lo, hi = 1, cfg.max_seq_len // ref.SEQ_STEP + 1  # the first failing step is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if predict(plan, cfg, mid * ref.SEQ_STEP) <= _budget(card_bytes):
            lo = mid + 1
        else:
            hi = mid
    return (lo - 1) * ref.SEQ_STEP
