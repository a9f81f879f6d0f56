"""Checks of lesson 07 (solutions/07_quantization.ipynb): Q8_0 and Q4_0 block formats in Triton, the weight-only
int8 matmul, blockwise 8-bit states on the dynamic code, AdamW8bit, and its convergence against AdamW.

Block formats: the round trip must stay within the format's bound (Q8_0: d/2 per value, Q4_0: |d|, d the block's
stored scale) plus the rounding of the result to the output dtype, on Gaussian and heavy-tailed weights with
outliers, blocks of zeros and lengths that are not a multiple of 32, in fp32, fp16 and bf16. The check decodes
the learner's codes with its own decoder, so the layout is checked too, and the scales must be fp16(absmax / 127)
(Q8_0) or fp16(m / -8) (Q4_0). The matmul follows the course's rule against float64; its memory check forbids a
dequantized copy of the weight. The 8-bit states must hold the nearest level of the code, and AdamW8bit's first
step must match AdamW (its update uses the fp32 states before they are rounded).
"""
from __future__ import annotations

import math

import torch

import memfit
from autograder.checks import Check, CheckFailed, KernelSpec, call_learner, check_cases, expect_value_error
from autograder.checks.numerics import assert_close_by_rule, expect_like, expect_no_torch_arithmetic
from autograder.checks.numerics import case_dtypes as _dtypes, dtype_name as _name
from autograder.checks.numerics import poisoned_allocations
from autograder.checks.references import reference
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak

QK = 32
FORMATS = {"q8_0": dict(code_dtype=torch.int8, code_bytes=32, bound=0.5),
           "q4_0": dict(code_dtype=torch.uint8, code_bytes=16, bound=1.0)}
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the block formats run in bf16 even interpreted


def _given():
    """The lesson's given code (not an exercise): Quantized, dynamic_code."""
    import memfit.from_lessons.quantization as given
    return given


# ------------------------------------------------------------------------------------------ weights

def weights(kind: str, shape, seed: int) -> torch.Tensor:
    """fp32 test weights on the CPU. gaussian: std 0.02. heavy: Student's t (3 dof) x 0.01 with a few outliers
    of 0.5. zeros: all zero. blocky: Gaussian with the first block zero and one outlier of 3.0."""
    gen = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if kind == "zeros":
        return torch.zeros(shape)
    w = torch.randn(n, generator=gen) * 0.02
    if kind == "heavy":
        w = torch.randn(n, generator=gen) / torch.sqrt(torch.rand(n, generator=gen).add_(0.05)) * 0.01
        idx = torch.randint(0, n, (max(1, n // 500),), generator=gen)
        w[idx] = 0.5 * torch.sign(torch.randn(idx.numel(), generator=gen))
    elif kind == "blocky":
        w[:QK] = 0
        w[min(n - 1, QK + 5)] = 3.0
    return w.view(shape)


def in_blocks(flat: torch.Tensor, block: int = QK) -> torch.Tensor:
    """A flat tensor padded with zeros to whole blocks, viewed as (blocks, block)."""
    return torch.nn.functional.pad(flat, (0, (-flat.numel()) % block)).view(-1, block)


def decode(fmt: str, data: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
    """The check's own decoder: float64 values of a Q8_0 / Q4_0 tensor, flattened."""
    d = scales.double()[:, None]
    if fmt == "q8_0":
        values = data.double() * d
    else:
        codes = torch.cat([data & 15, data >> 4], dim=1).double()  # byte j: value j (low), value j + 16 (high)
        values = (codes - 8) * d
    return values.reshape(-1)[:n]


def _expected_scales(fmt: str, w: torch.Tensor) -> torch.Tensor:
    """|d| per block as the format defines it: fp16(absmax / 127) for Q8_0, fp16(absmax / 8) for Q4_0."""
    flat = w.detach().reshape(-1).float().cpu()
    absmax = in_blocks(flat).abs().amax(dim=1)
    return (absmax / (127 if fmt == "q8_0" else 8)).half()


def _check_layout(fmt: str, qt, w: torch.Tensor, what: str) -> None:
    spec = FORMATS[fmt]
    blocks = math.ceil(w.numel() / QK)
    for name in ("data", "scales", "shape", "dtype"):
        if not hasattr(qt, name):
            raise CheckFailed(f"{what}: should return a Quantized (data, scales, shape, dtype), got "
                              f"{type(qt).__name__}")
    if qt.data.dtype != spec["code_dtype"] or tuple(qt.data.shape) != (blocks, spec["code_bytes"]):
        raise CheckFailed(f"{what}: data should be {spec['code_dtype']} of shape ({blocks}, {spec['code_bytes']}), "
                          f"got {qt.data.dtype} of shape {tuple(qt.data.shape)}")
    if qt.scales.dtype != torch.float16 or tuple(qt.scales.shape) != (blocks,):
        raise CheckFailed(f"{what}: scales should be fp16 of shape ({blocks},), got {qt.scales.dtype} of shape "
                          f"{tuple(qt.scales.shape)}")
    if tuple(qt.shape) != tuple(w.shape) or qt.dtype != w.dtype:
        raise CheckFailed(f"{what}: the Quantized should remember shape {tuple(w.shape)} and dtype {_name(w.dtype)}, "
                          f"got {tuple(qt.shape)} and {qt.dtype}")
    if qt.data.device != w.device or qt.scales.device != w.device:
        raise CheckFailed(f"{what}: codes and scales should be on {w.device}, got {qt.data.device} and "
                          f"{qt.scales.device}")
    got = qt.scales.detach().cpu()
    if torch.isnan(got.float()).any():
        raise CheckFailed(f"{what}: {int(torch.isnan(got.float()).sum())} scales are NaN: never written (check the "
                          "mask of the scales' store) or a division by zero in a block of zeros")
    expected = _expected_scales(fmt, w)
    ulp = torch.finfo(torch.float16).eps * expected.float().abs().clamp_min(2.0**-24)
    off = (got.float().abs() - expected.float()).abs() > ulp
    if off.any():
        i = int(off.nonzero()[0])
        rule = "fp16(absmax / 127)" if fmt == "q8_0" else "fp16(m / -8), m the block's value of largest magnitude"
        raise CheckFailed(f"{what}: the scale of block {i} is {got[i].item():.6g}, expected ±{expected[i].item():.6g} "
                          f"= {rule}")


def _check_round_trip(fmt: str, qt, w: torch.Tensor, dequantize, what: str) -> None:
    n = w.numel()
    exact = w.detach().double().reshape(-1).cpu()
    decoded = decode(fmt, qt.data.detach().cpu(), qt.scales.detach().cpu(), n)
    d = qt.scales.detach().cpu().double().abs().repeat_interleave(QK)[:n]
    bound = FORMATS[fmt]["bound"] * d * 1.01
    err = (decoded - exact).abs()
    if (err > bound).any():
        i = int((err - bound).argmax())
        raise CheckFailed(f"{what}: value {i} is {exact[i].item():.6g}, its codes decode to {decoded[i].item():.6g}; "
                          f"|error| {err[i].item():.3g} exceeds the format's bound {bound[i].item():.3g} "
                          f"({FORMATS[fmt]['bound']:g} x the block's scale): check the rounding and the clamp")
    with poisoned_allocations():
        out = call_learner(dequantize, qt, what=what.replace("quantize", "dequantize", 1))
    expect_like(out, w, what + ", dequantized")
    got = out.detach().double().reshape(-1).cpu()
    if torch.isnan(got).any():
        raise CheckFailed(f"{what}, dequantized: {int(torch.isnan(got).sum())} values are NaN: never written "
                          "(check the mask of the store)")
    # one ulp of the output dtype (a GPU rounds to nearest, half an ulp; Triton's interpreter truncates to bf16)
    rounding = decoded.abs() * torch.finfo(w.dtype).eps + torch.finfo(w.dtype).tiny
    if ((got - decoded).abs() > rounding).any():
        i = int(((got - decoded).abs() - rounding).argmax())
        raise CheckFailed(f"{what}, dequantized: value {i} is {got[i].item():.6g}, its codes decode to "
                          f"{decoded[i].item():.6g} (q x d rounded once to {_name(w.dtype)}, within one ulp): the layout or the "
                          "arithmetic of dequantize differs from quantize's")


BLOCK_VISIBLE = [("blocky", (1000,)), ("gaussian", (17,)), ("heavy", (40, 32))]
BLOCK_HIDDEN = [("gaussian", (1,)), ("heavy", (31,)), ("heavy", (33,)), ("heavy", (7, 9, 11)), ("zeros", (64,)),
                ("blocky", (4097,)), ("gaussian", (96, 65))]
BLOCK_HIDDEN_GPU = [("heavy", (4096, 1027))]


def _check_block_format(fmt: str, quantize, dequantize, cases: str) -> None:
    visible, hidden = check_cases(cases)
    plan = (BLOCK_VISIBLE if visible else []) + (BLOCK_HIDDEN + (BLOCK_HIDDEN_GPU if memfit.HAS_GPU else [])
                                                 if hidden else [])
    for seed, (kind, shape) in enumerate(plan):
        for dtype in ALL_DTYPES if (hidden or seed == 0) else (torch.float32,):
            w = weights(kind, shape, 70 + seed).to(memfit.DEVICE, dtype)
            what = f"quantize_{fmt}({kind} weights of shape {shape}, {_name(dtype)})"
            with poisoned_allocations():
                qt = call_learner(quantize, w, what=what)
            _check_layout(fmt, qt, w, what)
            _check_round_trip(fmt, qt, w, dequantize, what)
    if visible:
        w = weights("gaussian", (256,), 5).to(memfit.DEVICE)
        what = f"quantize_{fmt} on 256 fp32 values"
        _, report = measure_peak(lambda: call_learner(quantize, w, what=what), device=memfit.DEVICE,
                                 meter=LIVE_TENSORS, warmup=False)
        expect_no_torch_arithmetic(report.ops, what, "the absmax, the scale and the codes belong in your kernel")
        qt = call_learner(quantize, w, what=what)
        _, report = measure_peak(lambda: call_learner(dequantize, qt, what=what), device=memfit.DEVICE,
                                 meter=LIVE_TENSORS, warmup=False)
        expect_no_torch_arithmetic(report.ops, what.replace("quantize", "dequantize", 1), "q x d belongs in your kernel")
        expect_value_error(quantize, w.int(), what=f"quantize_{fmt} of an int32 tensor", why="naming the dtype")
        broken = type(qt)(qt.format, qt.data, qt.scales[:-1], qt.shape, qt.dtype)
        expect_value_error(dequantize, broken, what=f"dequantize_{fmt} of a Quantized missing a scale",
                           why="naming the inconsistent layout")
        other = "q4_0" if fmt == "q8_0" else "q8_0"
        expect_value_error(dequantize, type(qt)(other, qt.data, qt.scales, qt.shape, qt.dtype),
                           what=f"dequantize_{fmt} of a Quantized in format {other!r}", why="naming the format")


def check_q8_0(quantize_q8_0, dequantize_q8_0, cases: str = "visible") -> None:
    _check_block_format("q8_0", quantize_q8_0, dequantize_q8_0, cases)


def check_q4_0(quantize_q4_0, dequantize_q4_0, cases: str = "visible") -> None:
    _check_block_format("q4_0", quantize_q4_0, dequantize_q4_0, cases)


# ------------------------------------------------------------------------------------- int8 matmul

def reference_q8_0(w: torch.Tensor):
    """The check's own Q8_0 of w, as a Quantized (the lesson's given container)."""
    flat = w.detach().reshape(-1).float().cpu()
    blocks = in_blocks(flat)
    d = (blocks.abs().amax(dim=1) / 127).half()
    d32 = d.float()[:, None]
    ratio = torch.where(d32 > 0, blocks / torch.where(d32 > 0, d32, 1.0), 0.0)
    q = (ratio.sign() * (ratio.abs() + 0.5).floor()).clamp(-127, 127).to(torch.int8)
    return _given().Quantized("q8_0", q.to(w.device), d.to(w.device), w.shape, w.dtype)


# (M, N, K, leading dims of x)
MATMUL_VISIBLE = [(17, 40, 96, None), (1, 64, 64, None), (64, 130, 320, (2, 32))]
MATMUL_HIDDEN = [(5, 33, 32, None), (70, 100, 512, None), (33, 257, 160, (3, 11))]
MATMUL_HIDDEN_GPU = [(16, 4096, 4096, None), (300, 1000, 2048, None)]


def check_int8_matmul(int8_weight_matmul, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = (MATMUL_VISIBLE if visible else []) + (MATMUL_HIDDEN + (MATMUL_HIDDEN_GPU if memfit.HAS_GPU else [])
                                                  if hidden else [])
    dtypes = _dtypes(hidden)
    for seed, (m, n, k, lead) in enumerate(plan):
        for dtype in dtypes:
            gen = torch.Generator().manual_seed(90 + seed)
            x = torch.randn(*(lead or (m,)), k, generator=gen).to(memfit.DEVICE, dtype)
            w = weights("heavy", (n, k), 91 + seed).to(memfit.DEVICE, dtype)
            qw = reference_q8_0(w)
            w_hat = decode("q8_0", qw.data.cpu(), qw.scales.cpu(), n * k).view(n, k).to(memfit.DEVICE, dtype)
            what = f"int8_weight_matmul(x of shape {tuple(x.shape)}, {_name(dtype)}; weight {n} x {k} in Q8_0)"
            with poisoned_allocations():
                y = call_learner(int8_weight_matmul, x, qw, what=what)
            exact = x.double() @ w_hat.double().T
            same = x @ w_hat.T
            assert_close_by_rule(y, exact, same, what, floor_ulps=4 * math.sqrt(k) if dtype == torch.float32 else 4.0)
    if visible:
        x = torch.randn(4, 64, device=memfit.DEVICE)
        qw = reference_q8_0(weights("gaussian", (8, 64), 1).to(memfit.DEVICE))
        expect_value_error(int8_weight_matmul, x[:, :48], qw, what="int8_weight_matmul with x of 48 features and a "
                           "weight of 64", why="naming the shapes")
        expect_value_error(int8_weight_matmul, x.int(), qw, what="int8_weight_matmul with an int32 x",
                           why="naming the dtype")
        q4 = _given().Quantized("q4_0", torch.zeros(16, 16, dtype=torch.uint8, device=memfit.DEVICE), qw.scales,
                                qw.shape, qw.dtype)
        expect_value_error(int8_weight_matmul, x, q4, what="int8_weight_matmul with a Q4_0 weight",
                           why="naming the format")
        odd = reference_q8_0(weights("gaussian", (32, 48), 2).to(memfit.DEVICE))
        expect_value_error(int8_weight_matmul, torch.randn(4, 48, device=memfit.DEVICE), odd,
                           what="int8_weight_matmul with in_features=48", why="saying K must be a multiple of 32")


def check_int8_matmul_memory(int8_weight_matmul, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = []
    if visible:
        plan.append((16, 256, 512, torch.float32, LIVE_TENSORS))
    if memfit.HAS_GPU:
        half = torch.float16
        plan.append((16, 14336, 4096, half, None) if visible else (1, 4096, 14336, half, None))
    elif hidden:
        plan.append((3, 96, 1024, torch.float16, LIVE_TENSORS))
    for m, n, k, dtype, meter in plan:
        gen = torch.Generator().manual_seed(m + n)
        x = torch.randn(m, k, generator=gen).to(memfit.DEVICE, dtype)
        qw = reference_q8_0(weights("gaussian", (n, k), n).to(memfit.DEVICE, dtype))
        what = f"int8_weight_matmul(M={m}, N={n}, K={k}, {_name(dtype)})"
        _, report = measure_peak(lambda: call_learner(int8_weight_matmul, x, qw, what=what), device=memfit.DEVICE,
                                 meter=meter)
        w_hat_bytes = n * k * x.element_size()
        out_bytes = m * n * x.element_size()
        if report.largest_bytes is not None and report.largest_bytes >= w_hat_bytes // 2:
            raise CheckFailed(f"{what}: a tensor of {format_bytes(report.largest_bytes)} existed during the call; the "
                              f"dequantized weight is {format_bytes(w_hat_bytes)}: dequantize tiles in the kernel")
        allowed = int(1.05 * out_bytes) + (64 << 10)
        if report.peak_bytes > allowed:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds the output "
                              f"({format_bytes(out_bytes)}) + 5% + 64 KiB; a dequantized weight would be "
                              f"{format_bytes(w_hat_bytes)}")
        if meter == LIVE_TENSORS:
            expect_no_torch_arithmetic(report.ops, what, "the matmul belongs in your kernel")


# ------------------------------------------------------------------------------ 8-bit optimizer states

def _nearest_level(code: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The level of the sorted code nearest to each r (float64; ties to the lower level)."""
    levels = code.double()
    j = torch.searchsorted(levels, r).clamp(1, levels.numel() - 1)
    lo, hi = levels[j - 1], levels[j]
    return torch.where((hi - r).abs() < (r - lo).abs(), hi, lo)


def _nearest_distance(code: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return (_nearest_level(code, r) - r).abs()


def _check_state_codes(codes, absmax, exact: torch.Tensor, code: torch.Tensor, what: str, block: int = 256) -> None:
    """codes/absmax must be the blockwise nearest-level quantization of `exact` (float64, flattened)."""
    n = exact.numel()
    blocks = math.ceil(n / block)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.numel() != n:
        raise CheckFailed(f"{what}: codes should be uint8 with {n} values, got "
                          f"{getattr(codes, 'dtype', type(codes).__name__)} with {getattr(codes, 'numel', lambda: '?')()}")
    if not isinstance(absmax, torch.Tensor) or absmax.dtype != torch.float32 or absmax.numel() != blocks:
        raise CheckFailed(f"{what}: absmax should be fp32 with one value per block of {block}: {blocks}, got "
                          f"{getattr(absmax, 'dtype', type(absmax).__name__)} with "
                          f"{getattr(absmax, 'numel', lambda: '?')()}")
    padded = in_blocks(exact, block)
    ref_absmax = padded.abs().amax(dim=1)
    got_absmax = absmax.detach().double().cpu().reshape(-1)
    if ((got_absmax - ref_absmax).abs() > 1e-6 * ref_absmax + 1e-30).any():
        i = int(((got_absmax - ref_absmax).abs()).argmax())
        raise CheckFailed(f"{what}: block {i}'s absmax is {got_absmax[i].item():.6g}, expected "
                          f"{ref_absmax[i].item():.6g}: the largest |value| of each block of {block}")
    r = (padded / torch.where(ref_absmax > 0, ref_absmax, 1.0)[:, None]).reshape(-1)[:n]
    levels = code.double()[codes.detach().cpu().reshape(-1).long()]
    gap = (levels - r).abs() - _nearest_distance(code, r)
    if (gap > 2e-6).any():
        i = int(gap.argmax())
        raise CheckFailed(f"{what}: value {i} / its block's absmax is {r[i].item():.6g}; its code stands for "
                          f"{levels[i].item():.6g}, but the level {_nearest_level(code, r[i:i + 1]).item():.6g} is "
                          "nearer: store the index of the nearest level")


BLOCKWISE_VISIBLE = [("heavy", 1000, True), ("gaussian", 256, False), ("blocky", 300, True)]
BLOCKWISE_HIDDEN = [("gaussian", 1, True), ("zeros", 512, False), ("heavy", 70_001, False), ("heavy", 255, True),
                    ("blocky", 257, False)]


def check_blockwise(quantize_blockwise, dequantize_blockwise, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = (BLOCKWISE_VISIBLE if visible else []) + (BLOCKWISE_HIDDEN if hidden else [])
    for seed, (kind, n, signed) in enumerate(plan):
        code = _given().dynamic_code(signed)
        x = weights(kind, (n,), 120 + seed)
        if not signed:
            x = x * x * 100  # v: squares of gradients, many orders of magnitude
        x = x.to(memfit.DEVICE)
        what = f"quantize_blockwise({kind} values, n={n}, {'signed' if signed else 'unsigned'} code)"
        got = call_learner(quantize_blockwise, x, code.to(memfit.DEVICE), what=what)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailed(f"{what} should return (codes, absmax), got {type(got).__name__}")
        codes, absmax = got
        _check_state_codes(codes, absmax, x.double().cpu(), code, what)
        what = what.replace("quantize", "dequantize", 1)
        values = call_learner(dequantize_blockwise, codes, absmax, code.to(memfit.DEVICE), what=what)
        exact = code.double()[codes.cpu().long()] * absmax.double().cpu().repeat_interleave(256)[:n]
        if not isinstance(values, torch.Tensor) or values.dtype != torch.float32 or values.numel() != n:
            raise CheckFailed(f"{what}: should return {n} fp32 values, got "
                              f"{getattr(values, 'dtype', type(values).__name__)}")
        err = (values.detach().double().cpu().reshape(-1) - exact).abs()
        if (err > 1e-6 * exact.abs() + 1e-30).any():
            i = int(err.argmax())
            raise CheckFailed(f"{what}: value {i} is {values.reshape(-1)[i].item():.6g}, expected code[codes] x absmax "
                              f"= {exact[i].item():.6g} (a uint8 index tensor is a mask, not a gather: .long() it)")


# --------------------------------------------------------------------------------------- AdamW8bit

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _problem(seed: int, big=(300, 70), small=(50,)):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(big, generator=gen) * 0.1), (torch.randn(small, generator=gen) * 0.1)], gen


def _gradient(p: torch.Tensor, step: int) -> torch.Tensor:
    g = weights("heavy", tuple(p.shape), 1000 * step + p.numel()) * 10
    if step == 1 and p.numel() > 512:
        g.view(-1)[:256] = 0  # a block of zeros: absmax 0
    return g


def _simulate(params, steps: int, code_m, code_v, block=256, min_8bit=4096):
    """The check's float64 run of the algorithm (nearest levels, fp32-free): params after `steps` steps."""
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    ps = [p.double().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]

    def rounded(x, code):
        padded = in_blocks(x.reshape(-1), block)
        absmax = padded.abs().amax(dim=1)
        nearest = _nearest_level(code, (padded / torch.where(absmax > 0, absmax, 1.0)[:, None]).reshape(-1))
        return (nearest.view(-1, block) * absmax[:, None]).reshape(-1)[:x.numel()].view_as(x)

    for t in range(1, steps + 1):
        for i, p in enumerate(ps):
            g = _gradient(params[i], t).double()
            p.mul_(1 - lr * wd)
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            p.sub_(lr * (ms[i] / (1 - b1**t)) / ((vs[i] / (1 - b2**t)).sqrt() + eps))
            if p.numel() >= min_8bit:
                ms[i], vs[i] = rounded(ms[i], code_m), rounded(vs[i], code_v)
    return ps, ms, vs


def _learner_run(AdamW8bit, params, steps: int, what: str, **extra):
    leaves = [p.clone().to(memfit.DEVICE).requires_grad_(True) for p in params]
    opt = call_learner(AdamW8bit, leaves, **HYPER, what=f"AdamW8bit(params, {HYPER})", **extra)
    for t in range(1, steps + 1):
        for p in leaves:
            p.grad = _gradient(p.detach().cpu(), t).to(memfit.DEVICE)
        call_learner(opt.step, what=f"{what}, step {t}")
    return leaves, opt


def check_adamw8bit_step(AdamW8bit, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    given = _given()
    code_m, code_v = given.dynamic_code(True), given.dynamic_code(False)
    shapes = [((300, 70), (50,))] if visible else []
    shapes += [((257, 33), (7, 5))] if hidden else []
    for seed, (big, small) in enumerate(shapes):
        params, _ = _problem(140 + seed, big, small)
        what = f"AdamW8bit on a {big} weight (8-bit states) and a {small} one (fp32 states)"
        leaves, opt = _learner_run(AdamW8bit, params, 1, what)
        exact, ms, vs = _simulate(params, 1, code_m, code_v)
        same = [p.clone().requires_grad_(True) for p in params]
        torch_opt = torch.optim.AdamW(same, foreach=False, **HYPER)
        for p in same:
            p.grad = _gradient(p.detach(), 1)
        torch_opt.step()
        for name, got, e, s in zip(("the 8-bit weight", "the fp32-state weight"), leaves, exact, same):
            assert_close_by_rule(got.detach().cpu(), e, s.detach(), f"{what}: {name} after step 1 (the update uses "
                                 "the fp32 m and v, before they are rounded)", floor_ulps=4)
        state = opt.state[leaves[0]]
        for key, code in (("m", code_m), ("v", code_v)):
            if key not in state or key + "_absmax" not in state:
                raise CheckFailed(f"{what}: the 8-bit weight's state should hold {key!r} and {key + '_absmax'!r} "
                                  f"(the given _state creates them); it has {sorted(state)}")
            exact_state = (1 - HYPER["betas"][0]) * _gradient(params[0], 1).double() if key == "m" else \
                (1 - HYPER["betas"][1]) * _gradient(params[0], 1).double() ** 2
            _check_state_codes(state[key], state[key + "_absmax"], exact_state.reshape(-1), code,
                               f"{what}: state[{key!r}] after step 1")
        n = leaves[0].numel()
        state_bytes = sum(t.numel() * t.element_size() for k, t in state.items() if isinstance(t, torch.Tensor))
        allowed = 2 * (n + 4 * math.ceil(n / 256)) + 64
        if state_bytes > allowed:
            raise CheckFailed(f"{what}: the 8-bit weight's states take {state_bytes:,} bytes for {n:,} values "
                              f"({state_bytes / n:.2f} B/param); 8-bit m and v with fp32 absmax per 256 are "
                              f"{allowed - 64:,} ({(allowed - 64) / n:.3f} B/param)")
        steps = 8
        leaves, _ = _learner_run(AdamW8bit, params, steps, what)
        exact, _, _ = _simulate(params, steps, code_m, code_v)
        drift = max((got.detach().cpu().double() - e).abs().max().item() for got, e in zip(leaves, exact))
        allowed_drift = 0.01 * HYPER["lr"] * steps
        if drift > allowed_drift:
            raise CheckFailed(f"{what}: after {steps} steps a weight is {drift:.3g} away from the same algorithm run "
                              f"in float64 (allowed {allowed_drift:.3g}: a level or two of rounding): store the "
                              "updated m and v back, and dequantize them with their own block's absmax")
    if visible:
        numel = 1 << 18
        p = torch.zeros(numel, device=memfit.DEVICE, requires_grad=True)
        opt = call_learner(AdamW8bit, [p], lr=1e-3, chunk=4096, what="AdamW8bit([p], lr=1e-3, chunk=4096)")
        p.grad = torch.randn(numel, device=memfit.DEVICE)
        call_learner(opt.step, what="AdamW8bit.step")  # the states exist after the first step
        what = f"AdamW8bit(chunk=4096).step() on {numel:,} parameters"
        _, report = measure_peak(lambda: call_learner(opt.step, what=what), device=memfit.DEVICE, warmup=False)
        if report.peak_bytes > numel:
            raise CheckFailed(f"{what}: the step allocated {format_bytes(report.peak_bytes)} at its peak, over 1 byte "
                              f"per parameter ({format_bytes(numel)}; m alone in fp32 is {format_bytes(4 * numel)}): "
                              "dequantize, update and requantize one chunk at a time")
        expect_value_error(AdamW8bit, [p], 1e-3, (0.9, 0.999), 1e-8, 0.0, 4096, 1000,
                           what="AdamW8bit(..., chunk=1000)", why="saying chunk must be a multiple of 256")


# Two runs of the course's tiny GPT on the Markov corpus: AdamW (fp32 states) and the learner's AdamW8bit.
# The margin: every 20-step mean within 2% of AdamW's (the reference's largest gap on a CPU: 0.3%).
CONVERGENCE = dict(steps=200, lr=3e-3, batch=8, seq=64, window=20, margin=0.02)


def check_adamw8bit_convergence(AdamW8bit, cases: str = "visible") -> None:
    from memfit.gpt import COURSE_CONFIGS
    from memfit.training import loss_curve
    c = CONVERGENCE
    cfg = COURSE_CONFIGS["tiny"]

    def run(make):
        return loss_curve(cfg, make, c["steps"], c["batch"], c["seq"], device="cpu")

    ours = call_learner(run, lambda params: AdamW8bit(params, lr=c["lr"], weight_decay=0.1),
                        what=f"training course-tiny with AdamW8bit(params, lr={c['lr']}, weight_decay=0.1)")
    if not all(math.isfinite(x) for x in ours):
        first = next(i for i, x in enumerate(ours) if not math.isfinite(x))
        raise CheckFailed(f"AdamW8bit training course-tiny: the loss became {ours[first]} at step {first}")
    fp32 = reference(f"adamw8bit_convergence torch.optim.AdamW {sorted(c.items())}",
                     lambda: run(lambda params: torch.optim.AdamW(params, lr=c["lr"], weight_decay=0.1)))
    w = c["window"]
    for start in range(0, c["steps"], w):
        a, b = sum(ours[start:start + w]) / w, sum(fp32[start:start + w]) / w
        if abs(a - b) > c["margin"] * b:
            raise CheckFailed(f"AdamW8bit training course-tiny ({c['steps']} steps, lr {c['lr']}): the mean loss of "
                              f"steps {start}-{start + w - 1} is {a:.3f}, AdamW's is {b:.3f}; the margin is "
                              f"{c['margin']:.0%}")


CHECKS = [
    Check("q8_0", 3, check_q8_0, uses=("quantize_q8_0", "dequantize_q8_0"), timeout_s=600),
    Check("q4_0", 2, check_q4_0, uses=("quantize_q4_0", "dequantize_q4_0"), timeout_s=600),
    Check("int8_matmul", 3, check_int8_matmul, uses=("int8_weight_matmul",), timeout_s=600),
    Check("int8_matmul_memory", 1, check_int8_matmul_memory, uses=("int8_weight_matmul",), timeout_s=600),
    Check("blockwise", 2, check_blockwise, uses=("quantize_blockwise", "dequantize_blockwise")),
    Check("adamw8bit_step", 3, check_adamw8bit_step, uses=("AdamW8bit",), timeout_s=300),
    Check("adamw8bit_convergence", 2, check_adamw8bit_convergence, uses=("AdamW8bit",), timeout_s=600,
          references=True),
]

KERNELS = [
    KernelSpec("q8_0_quantize_kernel", "quant_blocks",
               {"x_ptr": "*{dtype}", "data_ptr": "*i8", "scale_ptr": "*fp16", "n": "i32", "n_blocks": "i32"},
               dtypes=("fp16", "bf16", "fp32")),
    KernelSpec("q8_0_dequantize_kernel", "quant_blocks",
               {"data_ptr": "*i8", "scale_ptr": "*fp16", "out_ptr": "*{dtype}", "n": "i32"},
               dtypes=("fp16", "bf16", "fp32")),
    KernelSpec("q4_0_quantize_kernel", "quant_blocks",
               {"x_ptr": "*{dtype}", "data_ptr": "*u8", "scale_ptr": "*fp16", "n": "i32", "n_blocks": "i32"},
               dtypes=("fp16", "bf16", "fp32")),
    KernelSpec("q4_0_dequantize_kernel", "quant_blocks",
               {"data_ptr": "*u8", "scale_ptr": "*fp16", "out_ptr": "*{dtype}", "n": "i32"},
               dtypes=("fp16", "bf16", "fp32")),
] + [
    KernelSpec("int8_matmul_kernel", "int8_matmul",
               {"x_ptr": "*{dtype}", "data_ptr": "*i8", "scale_ptr": "*fp16", "y_ptr": "*{dtype}", "M": "i32",
                "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"},
               dtypes=(dtype,), variant=variant, constexprs=dict(IEEE=dtype == "fp32"))
    for variant in ("small_m", "large_m") for dtype in ("fp16", "fp32")
]
