"""Checks of lesson 07 (solutions/07_quantization.ipynb): Q8_0 and Q4_0 block formats in Triton, the weight-only
int8 matmul, blockwise 8-bit states on the dynamic code, AdamW8bit, and its convergence against AdamW.

Block formats: the bytes llama.cpp's reference quantizers write (ggml-quants.c; gguf.quants in Python, against which
tests/test_gguf_parity.py checks llama_quantize), every scale and every code exact (the last block's padding
included). Q8_0: d = absmax / 127 in fp32, codes roundf(x · id) with id = 1 / d in fp32, d stored in fp16. Q4_0:
d = m / -8 with m the first value of largest magnitude and its sign, codes min(15, trunc(x · id + 8.5)), each
operation rounded to fp32. A block of zeros: d = 0 (either sign), codes 0 / 8. A block whose 1 / d overflows
(0 < |d| <= 2^-128; not among the cases): codes 0, as on x86. The round trip must stay within the
format's bound: (1/2 or 1) · |d| + (127 or 8) · |d - d̂|, d̂ the stored fp16 scale. The cases cover Gaussian and
heavy-tailed weights, blocks of zeros, blocks whose extreme is negative, +a and -a tied for the extreme, exact
halves (0.5 - 2^-25 included), values within two fp32 steps of a boundary between codes, tiny values (the fp16
scale subnormal or 0), 1 to 3 dimensions, non-contiguous views and lengths against the block of 32, in fp32, fp16
and bf16; guard regions around what the learner allocates catch a store past the end. The matmul follows the
course's rule against float64 (on Triton's interpreter a dot left at TF32 is rounded to TF32, as a GPU would), for
x of 1 to 3 dimensions, strided, and tiles against ragged M, N and K; its memory check forbids a dequantized copy
of the weight and any bytes kept after the call. The 8-bit states must hold the nearest level of the code, with
the default and another block; AdamW8bit is graded with the reference quantize_blockwise / dequantize_blockwise (a
bug there costs exercise 4's points only): its first step must match AdamW (the update uses the fp32 states
before they are rounded), its states the nearest levels, over one chunk and several, and it may not touch the
gradients.

Each check iterates over case records (BLOCK_CASES, MATMUL_CASES, ...): AXES lists what each exercise's text lets
vary, and case_axes reads the same records. q8_0, q4_0 and blockwise also grade hidden cases drawn from their
exercises' whole domains (autograder/checks/domain.py).
"""
from __future__ import annotations

import contextlib
import math
import inspect
from dataclasses import dataclass

import torch

import memfit
import memfit.from_lessons.quantization as lesson  # the reference: imported before the grading child's guards
import triton.language as tl  # the fused optimizer's dtypes, for its compile spec
from autograder.checks import (Check, CheckFailed, KernelSpec, call_learner, check_cases, select, expect_value_error,
                               given_references)
from autograder.checks.numerics import assert_close_by_rule, expect_like, expect_no_torch_arithmetic, seeded_generator
from autograder.checks.numerics import call_pure, dtype_name as _name, guarded_allocations, overlaps, summation_bound
from autograder.checks.domain import Choice, Impossible, Sizes, grade_drawn
from autograder.checks.references import reference
from memfit.hardware import config as _config
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak

QK = 32
# bound: the error of a code under the fp32 scale d, in units of |d|; spread: the largest |code - 0 or 8|, which
# multiplies the fp16 rounding of the scale in the round trip's error
FORMATS = {"q8_0": dict(code_dtype=torch.int8, code_bytes=32, bound=0.5, spread=127, rule="|d|/2 + 127·|d - d̂|"),
           "q4_0": dict(code_dtype=torch.uint8, code_bytes=16, bound=1.0, spread=8, rule="|d| + 8·|d - d̂|")}
# The block formats run in bf16 even interpreted (the text: "in fp32, fp16 and bf16"); the profile's dtypes are a
# subset. The matmul is graded in the profile's dtypes (Triton's interpreter cannot multiply bf16 tiles).
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
NAMES = {v: k for k, v in DTYPES.items()}
PROFILE_DTYPES = tuple(NAMES[d] for d in memfit.profile().dtypes)
KEPT_SLACK = 1024  # bytes a call may leave allocated (allocator rounding); a cached scratch is far more


def _given():
    """The lesson's given code (not an exercise): Quantized, dynamic_code."""
    return lesson


_plan = select  # (autograder/checks/__init__.py: one planner for every check module)


def _n_vs_block(n: int, block: int = QK) -> str:
    if n == 1:
        return "1"
    if n < block:
        return "below one block"
    return "whole blocks" if n % block == 0 else "a partial last block"



def _quantized_tensors(obj) -> list[tuple[str, torch.Tensor]]:
    return [(f"its {name}", getattr(obj, name)) for name in ("data", "scales")
            if isinstance(getattr(obj, name, None), torch.Tensor)]


def _call_pure_q(fn, *args, what: str):
    """call_pure, and the same for the tensors inside Quantized arguments and results: inputs unchanged, the
    result sharing no memory with an input."""
    held = [(f"argument {i + 1}'s {name[4:]}", t) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)
            for name, t in _quantized_tensors(a)]
    before = [t.detach().clone() for _, t in held]
    result = call_pure(fn, *args, what=what)
    for (name, t), old in zip(held, before):
        if not torch.equal(t.detach(), old):
            raise CheckFailed(f"{what}: {name} was changed by the call: leave the inputs as they were")
    inputs = [(f"argument {i + 1}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)] + held
    for out_name, out in _quantized_tensors(result):
        for name, t in inputs:
            if overlaps(out, t):
                raise CheckFailed(f"{what}: the result's {out_name[4:]} shares memory with {name}: return new "
                                  "tensors, not views of an input")
    return result


# ------------------------------------------------------------------------------------------ weights

def weights(kind: str, shape, seed: int, fmt: str = "q8_0") -> torch.Tensor:
    """fp32 test weights on the CPU. gaussian: std 0.02. heavy: Student's t (3 dof) x 0.01 with a few outliers
    of 0.5. zeros: all zero. blocky: Gaussian with the first block zero and one outlier of 3.0. negative: Gaussian
    where each block's extreme value is negative and a positive value of 0.98 its magnitude follows it (Q4_0
    clamps that one). ties: exact halves: scales that are powers of two and values whose x · id is exactly halfway
    between two codes (Q8_0: k + 0.5; Q4_0: x · id + 8.5 an integer), and x · id = ±(0.5 - 2^-25), where
    floor(v + 0.5) in fp32 goes wrong. near: near halves: a random scale per block and values within two fp32
    steps of (k + 0.5) · d, where x · id and x / d, or the fp32 and the fp16 scale, give different codes. tied: +a
    and -a both the block's largest magnitude, in either order and in either half of the block. tiny: Gaussian
    blocks scaled by 1e-5 .. 1e-30, whose fp16 scale is subnormal or 0."""
    gen = seeded_generator(seed)
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
    elif kind == "negative":
        for s in range(0, n, QK):
            e = min(s + QK, n)
            top = w[s:e].abs().max().item()
            w[s + (s // QK) % (e - s)] = -1.5 * top - 0.01
            if e - s > 1:
                w[s + (s // QK + 1) % (e - s)] = 0.98 * (1.5 * top + 0.01)
    elif kind == "ties":
        if fmt == "q8_0":  # d = 127 * 2^-7 / 127 = 2^-7, id = 2^7; values (2k + 1) * 2^-8: x * id = k + 0.5
            w = (2 * torch.randint(-127, 127, (n,), generator=gen) + 1).float() * 2.0**-8
            extreme = 127 * 2.0**-7
        else:  # d = -m / 8 = 2^-7 for m = -2^-4; values (j - 0.5) * 2^-7: x * id + 8.5 = j + 8
            w = (torch.randint(-7, 9, (n,), generator=gen).float() - 0.5) * 2.0**-7
            extreme = -(2.0**-4)
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0) if fmt == "q8_0" else torch.ones(n)
        w[::QK] = extreme * sign[::QK]
        edge = (0.5 - 2.0**-25) * 2.0**-7  # x * id = 0.5 - 2^-25: roundf gives 0, floor(v + 0.5) in fp32 gives 1
        w[1::QK] = edge
        w[2::QK] = -edge
    elif kind == "near":
        blocks = math.ceil(n / QK)
        top = (torch.rand(blocks, generator=gen) * 0.09 + 0.01).float()
        if fmt == "q8_0":
            m = top * torch.where(torch.rand(blocks, generator=gen) < 0.5, -1.0, 1.0)
            d, k = top / 127, torch.randint(-127, 127, (blocks, QK), generator=gen).float()
        else:
            m = top * torch.where(torch.rand(blocks, generator=gen) < 0.5, -1.0, 1.0)
            d, k = m / -8, torch.randint(-8, 8, (blocks, QK), generator=gen).float()
        x = (k + 0.5) * d[:, None]  # fp32: within an fp32 step of a boundary between two codes
        for _ in range(2):  # then 0, 1 or 2 fp32 steps up or down
            step = torch.randint(-1, 2, x.shape, generator=gen)
            x = torch.where(step > 0, torch.nextafter(x, torch.full_like(x, math.inf)),
                            torch.where(step < 0, torch.nextafter(x, torch.full_like(x, -math.inf)), x))
        x[:, 0] = m  # the block's extreme
        w = x.reshape(-1)[:n].clone()
    elif kind == "tied":
        for b, s in enumerate(range(0, n, QK)):
            e = min(s + QK, n)
            if e - s < 2:
                continue
            a = 1.5 * w[s:e].abs().max().item() + 0.01
            first, second = sorted(torch.randperm(e - s, generator=gen)[:2].tolist())
            w[s + first], w[s + second] = (-a, a) if b % 2 == 0 else (a, -a)
    elif kind == "tiny":
        exponents = (5, 6, 7, 9, 12, 20, 30)
        for b, s in enumerate(range(0, n, QK)):
            w[s:s + QK] *= 10.0 ** -exponents[b % len(exponents)]
    return w.view(shape)


def in_blocks(flat: torch.Tensor, block: int = QK) -> torch.Tensor:
    """A flat tensor padded with zeros to whole blocks, viewed as (blocks, block)."""
    return torch.nn.functional.pad(flat, (0, (-flat.numel()) % block)).view(-1, block)


def unpack(fmt: str, data: torch.Tensor) -> torch.Tensor:
    """The codes of each block, (blocks, 32) int64: Q4_0's byte j holds value j (low) and value j + 16 (high)."""
    data = data.long()
    return data if fmt == "q8_0" else torch.cat([data & 15, data >> 4], dim=1)


def decode(fmt: str, data: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
    """The check's own decoder: float64 values of a Q8_0 / Q4_0 tensor, flattened."""
    d = scales.double()[:, None]
    codes = unpack(fmt, data).double()
    values = codes * d if fmt == "q8_0" else (codes - 8) * d
    return values.reshape(-1)[:n]


def roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf of fp32 values, exactly: the nearest integer, halves away from zero."""
    a = v.abs()
    whole = a.floor()
    r = torch.where(a - whole >= 0.5, whole + 1, whole)
    return torch.where(v < 0, -r, r)


def _reciprocal(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d != 0, 1 / torch.where(d != 0, d, 1.0), 0.0)


@dataclass
class Llama:
    """A tensor quantized as llama.cpp's reference quantizers do (ggml-quants.c's quantize_row_q8_0_ref and
    quantize_row_q4_0_ref; gguf.quants in Python), every step in fp32 on the CPU: tests/test_gguf_parity.py checks
    it against gguf byte for byte."""
    x: torch.Tensor  # fp32 (blocks, 32): the values, the last block padded with zeros
    m: torch.Tensor  # fp32 (blocks,): absmax (Q8_0) or the first value of largest magnitude, signed (Q4_0)
    d: torch.Tensor  # fp32 (blocks,): m / 127 or m / -8
    scales: torch.Tensor  # fp16 (blocks,): d as stored
    v: torch.Tensor  # fp32 (blocks, 32): x * id (Q8_0) or x * id + 8.5 (Q4_0), each operation rounded to fp32
    codes: torch.Tensor  # int64 (blocks, 32)


def llama_quantize(fmt: str, w: torch.Tensor) -> Llama:
    x = in_blocks(w.detach().reshape(-1).float().cpu())
    if fmt == "q8_0":
        m = x.abs().amax(dim=1)
        d = m / 127
        inverse = _reciprocal(d)[:, None]
        v = x * inverse
        codes = roundf(v)
    else:
        amax = x.abs().amax(dim=1, keepdim=True)
        first = (x.abs() == amax).int().argmax(dim=1, keepdim=True)  # the first one
        m = torch.where(amax[:, 0] > 0, x.gather(1, first)[:, 0], 0.0)  # a block of zeros: C's initial +0.0
        d = m / -8
        inverse = _reciprocal(d)[:, None]
        v = x * inverse + 8.5
        codes = v.trunc().clamp(0, 15)
    # 0 < |d| <= 2^-128: 1 / d overflows, v is ±inf or NaN, and C's conversion to an integer (undefined) gives 0 on
    # x86, where llama.cpp and gguf run. No graded case reaches it (tests/test_gguf_parity.py does).
    codes = torch.where(inverse.isinf(), 0.0, codes)
    return Llama(x, m, d, d.half(), v, codes.long())


def _check_layout(fmt: str, qt, w: torch.Tensor, what: str) -> Llama:
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
    got = qt.scales.detach().cpu().float()
    if torch.isnan(got).any():
        raise CheckFailed(f"{what}: {int(torch.isnan(got).sum())} scales are NaN: never written (check the mask of "
                          "the scales' store) or a division by zero in a block of zeros")
    ref = llama_quantize(fmt, w)
    expected = ref.scales.float()
    # The format's bytes: a zero scale's sign too (llama.cpp's Q4_0 stores a block of +0s as d = +0 / -8 = -0)
    off = qt.scales.detach().cpu().view(torch.int16) != ref.scales.view(torch.int16)
    if off.any():
        i = int(off.nonzero()[0])
        head = f"{what}: the scale of block {i} is {got[i].item():.6g}, expected {expected[i].item():.6g}"
        if got[i] == expected[i]:  # zeros of opposite signs
            raise CheckFailed(f"{head} (fp16 bytes {_fp16_hex(got[i])}, expected {_fp16_hex(expected[i])}): the "
                              "format stores a scale's sign bit too; d = m / -8 in fp32 keeps the sign IEEE gives it, "
                              "so a block whose m is +0 has d = -0")
        if fmt == "q8_0":
            why = ("d = absmax / 127 is never negative" if got[i] == -expected[i] else
                   f"absmax = {ref.m[i].item():.6g}, d = absmax / 127 computed in fp32, then stored in fp16")
            raise CheckFailed(f"{head} = fp16(absmax / 127): {why}")
        block = ref.x[i]
        top = block.abs().max()
        if got[i] == -expected[i] and (block == top).any() and (block == -top).any():
            j = int((block.abs() == top).int().argmax())
            why = (f"+{top.item():.6g} and -{top.item():.6g} both have the largest magnitude; m is the first of them "
                   f"in the block (value {j}, {block[j].item():.6g}), as llama.cpp's scan keeps the first")
        elif got[i] == -expected[i]:
            why = "the scale is signed: m keeps its sign, so a block whose extreme value is negative has d > 0"
        else:
            why = f"m = {ref.m[i].item():.6g}, d = m / -8 computed in fp32, then stored in fp16"
        raise CheckFailed(f"{head} = fp16(m / -8), m the block's value of largest magnitude with its sign: {why}")
    return ref


def _fp16_hex(value: torch.Tensor) -> str:
    return f"0x{int(value.to(torch.float16).view(torch.int16)) & 0xFFFF:04x}"


_CODE_HINTS = {
    "fp16": "that is the code the fp16 scale gives: llama.cpp computes the codes with the fp32 d and rounds d to fp16 "
            "only to store it",
    "division": "that is the code of x / d, which rounds differently from x · id here: compute id = 1 / d once per "
                "block and multiply, as llama.cpp does (on a GPU, with tl.math.div_rn: Triton's / is approximate)",
    "floor": "that is floor(v + 0.5) with v + 0.5 rounded to fp32 first: roundf compares |v| - floor(|v|) with 0.5 "
             "(the given round_half_away)",
    "fma": "that is x · id + 8.5 rounded once, as an fma: llama.cpp rounds the product to fp32, then the sum (the "
           "given launch_blocks compiles without the fusion)",
}


def _departures(fmt: str, ref: Llama, stored: torch.Tensor) -> dict[str, torch.Tensor]:
    """The codes of the usual departures from llama.cpp's rule, for every value: the fp16 scale, x / d, and
    floor(v + 0.5) (Q8_0) or one rounding for x · id + 8.5 (Q4_0)."""
    x, d = ref.x, ref.d[:, None]
    inverse16 = _reciprocal(stored.float())[:, None]
    quotient = torch.where(d != 0, x / torch.where(d != 0, d, 1.0), 0.0)
    if fmt == "q8_0":
        v = ref.v
        return {"fp16": roundf(x * inverse16), "division": roundf(quotient),
                "floor": torch.where(v >= 0, (v + 0.5).floor(), -(0.5 - v).floor())}
    fused = (x.double() * _reciprocal(ref.d).double()[:, None] + 8.5).float()
    return {name: t.trunc().clamp(0, 15) for name, t in
            (("fp16", x * inverse16 + 8.5), ("division", quotient + 8.5), ("fma", fused))}


def _code_hint(fmt: str, ref: Llama, got: torch.Tensor, stored: torch.Tensor, b: int, j: int) -> str:
    """Why the codes differ from llama.cpp's, when one of the usual departures explains it: one that explains every
    wrong code first, else one that explains the first."""
    wrong = got != ref.codes
    departures = {name: codes.long() for name, codes in _departures(fmt, ref, stored).items()}
    for name, codes in departures.items():
        if torch.equal(codes[wrong], got[wrong]):
            return _CODE_HINTS[name]
    # On a GPU a kernel's own rounding (Triton's approximate /, an fma) follows none of the rules computed here
    gpu = (" On a GPU, check the kernel's rounding first: Triton's / is approximate (tl.math.div_rn divides exactly), "
           "and a product and a sum fuse into one fma unless launch_blocks' options turn the fusion off."
           if memfit.HAS_GPU else "")
    for name, codes in departures.items():
        if codes[b, j] == got[b, j]:
            return _CODE_HINTS[name] + gpu
    if gpu:
        return gpu.strip()
    v = ref.v[b, j]
    if fmt == "q8_0" and (v.abs() - v.abs().floor()) == 0.5:
        return f"x · id = {v.item():.9g} is exactly halfway: roundf rounds halves away from zero"
    return ""


def _check_codes(fmt: str, qt, w: torch.Tensor, what: str, ref: Llama | None = None) -> None:
    """Every code (the last block's padding included) is llama.cpp's, exactly."""
    ref = ref or llama_quantize(fmt, w)
    got = unpack(fmt, qt.data.detach().cpu())
    ok = got == ref.codes
    if ok.all():
        return
    b, j = (int(v) for v in (~ok).nonzero()[0])
    i = b * QK + j
    n = w.numel()
    zero_code = 0 if fmt == "q8_0" else 8
    if ref.d[b] == 0:
        text = f"a block of zeros has d = 0 and codes {zero_code}"
    elif fmt == "q8_0":
        text = "roundf(x · id), id = 1 / d, d = absmax / 127, all in fp32 (halves away from zero)"
    else:
        text = "min(15, trunc(x · id + 8.5)), id = 1 / d, d = m / -8, all in fp32"
    where = (f"value {i} ({ref.x[b, j].item():.9g}; d = {ref.d[b].item():.9g} in fp32)" if i < n else
             f"position {i} (the zero padding of the last block; n = {n})")
    hint = _code_hint(fmt, ref, got, qt.scales.detach().cpu(), b, j)
    raise CheckFailed(f"{what}: the code of {where} is {int(got[b, j])}, expected {int(ref.codes[b, j])}: {text}"
                      + (f"; {hint}" if hint else ""))


def _check_round_trip(fmt: str, qt, w: torch.Tensor, what: str, ref: Llama | None = None) -> None:
    """|x - x̂| within the format's bound: (1/2 or 1) · |d| + (127 or 8) · |d - d̂|, d the fp32 scale, d̂ the fp16
    one stored (the codes are made with d, the decoder multiplies by d̂), plus fp32's rounding of x · id."""
    ref = ref or llama_quantize(fmt, w)
    n = w.numel()
    exact = w.detach().double().reshape(-1).cpu()
    decoded = decode(fmt, qt.data.detach().cpu(), qt.scales.detach().cpu(), n)
    spec = FORMATS[fmt]
    d, d16 = ref.d.double().abs(), (ref.d.double() - ref.scales.double()).abs()
    bound = ((spec["bound"] + 1e-4) * d + spec["spread"] * d16).repeat_interleave(QK)[:n]
    err = (decoded - exact).abs()
    if (err > bound).any():
        i = int((err - bound).argmax())
        raise CheckFailed(f"{what}: value {i} is {exact[i].item():.6g}, its codes decode to {decoded[i].item():.6g}; "
                          f"|error| {err[i].item():.3g} exceeds the format's bound {bound[i].item():.3g} "
                          f"({spec['rule']}, d the block's fp32 scale, d̂ the fp16 one stored): check the rounding, "
                          "the clamp and the layout of the codes")


def _check_dequantized(fmt: str, out, qt, w: torch.Tensor, what: str) -> None:
    expect_like(out, w, what)
    decoded = decode(fmt, qt.data.detach().cpu(), qt.scales.detach().cpu(), w.numel())
    got = out.detach().double().reshape(-1).cpu()
    if torch.isnan(got).any():
        raise CheckFailed(f"{what}: {int(torch.isnan(got).sum())} values are NaN: never written "
                          "(check the mask of the store)")
    # one ulp of the output dtype (a GPU rounds to nearest, half an ulp; Triton's interpreter truncates to bf16)
    rounding = decoded.abs() * torch.finfo(w.dtype).eps + torch.finfo(w.dtype).tiny
    if ((got - decoded).abs() > rounding).any():
        i = int(((got - decoded).abs() - rounding).argmax())
        raise CheckFailed(f"{what}: value {i} is {got[i].item():.6g}, its codes decode to {decoded[i].item():.6g} "
                          f"(q x d rounded once to {_name(w.dtype)}, within one ulp): the layout or the arithmetic "
                          "of dequantize differs from quantize's")


@dataclass(frozen=True)
class BlockCase:
    kind: str  # gaussian, heavy, zeros, blocky, negative, ties, near, tied, tiny (see weights)
    shape: tuple
    dtypes: tuple  # names: fp32, fp16, bf16
    hidden: bool
    transposed: bool = False  # w is a transposed (non-contiguous) view
    gpu_only: bool = False

    def axes(self) -> dict:
        weights = {"gaussian": "gaussian", "heavy": "heavy-tailed", "zeros": "zero block", "blocky": "zero block",
                   "negative": "negative extreme", "ties": "exact halves", "near": "near halves",
                   "tied": "tied extremes", "tiny": "tiny values"}[self.kind]
        return {"weights": weights, "rank": len(self.shape), "n_vs_block": _n_vs_block(math.prod(self.shape)),
                "dtype": self.dtypes, "layout": "non-contiguous" if self.transposed else "contiguous"}


BLOCK_CASES = [
    BlockCase("blocky", (1000,), ("fp32", "fp16"), False),
    BlockCase("gaussian", (17,), ("fp32",), False),
    BlockCase("gaussian", (1,), ("fp16",), False),
    BlockCase("heavy", (40, 32), ("fp32", "bf16"), False),
    BlockCase("negative", (3, 5, 7), ("fp32", "bf16"), False),
    BlockCase("ties", (2, 64), ("fp32", "fp16"), False),
    BlockCase("near", (8, 32), ("fp32",), False),
    BlockCase("tied", (4, 40), ("fp32", "fp16"), False),
    BlockCase("tiny", (7, 32), ("fp32", "fp16", "bf16"), False),
    BlockCase("heavy", (12, 10), ("fp32", "fp16"), False, transposed=True),
    BlockCase("gaussian", (1,), ("fp32", "bf16"), True),
    BlockCase("heavy", (31,), ("fp16", "bf16"), True),
    BlockCase("heavy", (33,), ("fp16",), True),
    BlockCase("heavy", (7, 9, 11), ("fp32", "bf16"), True),
    BlockCase("zeros", (64,), ("fp32", "fp16"), True),
    BlockCase("blocky", (4097,), ("bf16",), True),
    BlockCase("gaussian", (24, 65), ("fp16",), True),
    BlockCase("negative", (5, 70), ("fp32", "bf16"), True),
    BlockCase("ties", (160,), ("fp32", "bf16"), True),
    BlockCase("near", (3, 100), ("fp32", "fp16"), True),
    BlockCase("tied", (161,), ("fp32", "bf16"), True),
    BlockCase("tiny", (7, 33), ("fp32", "fp16"), True),
    BlockCase("heavy", (21, 30), ("fp32", "fp16"), True, transposed=True),
    BlockCase("heavy", (4096, 1027), ("fp16", "bf16"), True, gpu_only=True),
    BlockCase("near", (2048, 256), ("fp32",), True, gpu_only=True),
]


@dataclass(frozen=True)
class BlockMemoryCase:
    n: int  # a length no numerics case uses: a cache keyed by size cannot hide
    dtype: str
    hidden: bool
    gpu_only: bool = False

    def axes(self) -> dict:
        return {"memory": ("quantize", "dequantize"), "memory_dtype": self.dtype}


# Each graded dtype, run once by the visible part and by the hidden part alike (hidden=None): the meter's
# collections cost more than the kernels at these sizes.
BLOCK_MEMORY_CASES = [BlockMemoryCase(288, "fp32", None), BlockMemoryCase(200, "fp16", None),
                      BlockMemoryCase(250, "bf16", None)]


@dataclass(frozen=True)
class BlockInvalidCase:
    invalid: str  # int tensor, missing scale, other format
    hidden: bool
    gpu_only: bool = False

    def axes(self) -> dict:
        return {"invalid": self.invalid}


BLOCK_INVALID_CASES = [BlockInvalidCase(kind, hidden) for hidden in (False, True)
                       for kind in ("int tensor", "missing scale", "other format")]


def _block_memory(fmt: str, quantize, dequantize, case: BlockMemoryCase) -> None:
    dtype = DTYPES[case.dtype]
    w = weights("gaussian", (case.n,), case.n).to(memfit.DEVICE, dtype)
    blocks = math.ceil(case.n / QK)
    qbytes = blocks * (FORMATS[fmt]["code_bytes"] + 2)
    slack = 2048 if memfit.HAS_GPU else 0  # the CUDA allocator rounds each tensor up to 512 bytes
    for call, fn, args, budget, rule in (
            ("quantize", quantize, None, qbytes, "the codes and the scales"),
            ("dequantize", dequantize, None, case.n * w.element_size(), "the output")):
        what = f"{call}_{fmt} on {case.n} {_name(dtype)} values"
        if call == "quantize":
            run = lambda: call_learner(quantize, w, what=what)  # noqa: E731
        else:
            qt = lesson.quantize_q8_0(w) if fmt == "q8_0" else lesson.quantize_q4_0(w)
            run = lambda: call_learner(dequantize, qt, what=what)  # noqa: E731
        hint = "the absmax, the scale and the codes belong in your kernel" if call == "quantize" else \
            "q x d belongs in your kernel"
        # no warm-up on the live-tensor meter: a scratch cached by the call is still counted as kept
        _, report = measure_peak(run, device=memfit.DEVICE, warmup=memfit.HAS_GPU)
        if report.meter == LIVE_TENSORS:
            expect_no_torch_arithmetic(report.ops, what, hint)
        else:
            _, live = measure_peak(run, device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
            expect_no_torch_arithmetic(live.ops, what, hint)
        if report.peak_bytes > budget + slack:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds "
                              f"{format_bytes(budget)} ({rule}){' + 2 KiB' if slack else ''}: no temporaries the size "
                              "of the input, and no copy of it in another dtype")
        if report.kept_bytes > KEPT_SLACK:
            raise CheckFailed(f"{what}: {format_bytes(report.kept_bytes)} stayed allocated after the call, beyond its "
                              "result (a tensor cached in a global or on an object?): a call keeps nothing")


def _block_invalid(fmt: str, quantize, dequantize, case: BlockInvalidCase) -> None:
    other = "q4_0" if fmt == "q8_0" else "q8_0"
    w = weights("gaussian", (100 if case.hidden else 64,), 9).to(memfit.DEVICE)
    Quantized = _given().Quantized
    blocks = math.ceil(w.numel() / QK)
    qt = Quantized(fmt, torch.zeros(blocks, FORMATS[fmt]["code_bytes"], dtype=FORMATS[fmt]["code_dtype"],
                                    device=w.device), torch.ones(blocks, dtype=torch.float16, device=w.device),
                   w.shape, w.dtype)
    if case.invalid == "int tensor":
        bad = w.long() if case.hidden else w.int()
        expect_value_error(quantize, bad, what=f"quantize_{fmt} of an {_name(bad.dtype)} tensor",
                           why="naming the dtype")
    elif case.invalid == "missing scale":
        scales = qt.scales[:-1] if not case.hidden else torch.cat([qt.scales, qt.scales[:1]])
        expect_value_error(dequantize, Quantized(fmt, qt.data, scales, qt.shape, qt.dtype),
                           what=f"dequantize_{fmt} of a Quantized with {scales.numel()} scales for "
                                f"{qt.scales.numel()} blocks", why="naming the inconsistent layout")
    else:
        expect_value_error(dequantize, Quantized(other, qt.data, qt.scales, qt.shape, qt.dtype),
                           what=f"dequantize_{fmt} of a Quantized in format {other!r}", why="naming the format")


def _check_block_one(fmt: str, quantize, dequantize, w: torch.Tensor, kind: str, view: str = "") -> None:
    """One tensor through quantize (every scale and code exact, the round trip within the bound) and dequantize."""
    what = f"quantize_{fmt}({kind} weights of shape {tuple(w.shape)}{view}, {_name(w.dtype)})"
    with guarded_allocations(what):
        qt = _call_pure_q(quantize, w, what=what)
    ref = _check_layout(fmt, qt, w, what)
    _check_round_trip(fmt, qt, w, what, ref)
    _check_codes(fmt, qt, w, what, ref)
    dq_what = what.replace("quantize", "dequantize", 1) + ", dequantized"
    with guarded_allocations(dq_what):
        out = _call_pure_q(dequantize, qt, what=dq_what)
    _check_dequantized(fmt, out, qt, w, dq_what)


def block_domain() -> dict:
    """Every tensor exercises 1 and 2 allow: 1 to 3 dimensions, last-dimension lengths around the block of 32 and a
    program's BLOCKS blocks, every kind of weights of BLOCK_CASES, each dtype, contiguous or a view (transposed, or
    rows of a wider tensor) (autograder/checks/domain.py draws hidden cases from it)."""
    program = QK * _config("quant_blocks")["BLOCKS"]
    return {"n": Sizes(1, max(300, program + 1), edges=(1, QK - 1, QK, QK + 1, program - 1, program, program + 1)),
            "rank": Choice(1, 2, 3), "lead": Sizes(1, 5),
            "weights": Choice("gaussian", "heavy", "zeros", "blocky", "negative", "ties", "near", "tied", "tiny"),
            "dtype": Choice(*(NAMES[d] for d in ALL_DTYPES)),
            "layout": Choice("contiguous", "transposed", "column slice", "every other value")}


def _drawn_block_tensor(fmt: str, d: dict) -> tuple[torch.Tensor, str]:
    """The drawn weights as the view the case names, holding the values in w.reshape(-1)'s order that weights()
    laid out by blocks (ties, tied extremes stay where they were put)."""
    shape = {1: (d["n"],), 2: (d["lead"], d["n"]), 3: (d["lead"], 2, d["n"])}[d["rank"]]
    w = weights(d["weights"], shape, d["seed"], fmt).to(memfit.DEVICE, DTYPES[d["dtype"]])
    view = ""
    if d["layout"] == "every other value":  # a view reshape(-1) keeps strided
        wide = torch.zeros(*shape[:-1], 2 * d["n"], dtype=w.dtype, device=w.device)
        wide[..., ::2] = w
        w, view = wide[..., ::2], ", every other value of a wider one"
    elif d["layout"] != "contiguous":
        if d["rank"] == 1:
            raise Impossible()  # a 1-D tensor has no transposed view, and a 1-D slice of a wider one is contiguous
        if d["layout"] == "transposed":
            w, view = w.transpose(-1, -2).contiguous().transpose(-1, -2), ", a transposed view"
        else:
            wide = torch.zeros(*shape[:-1], d["n"] + 7, dtype=w.dtype, device=w.device)
            wide[..., :d["n"]] = w
            w, view = wide[..., :d["n"]], ", each row a slice of a wider one"
    return w, view


DRAWN_BLOCK_CASES = 10


def _check_block_format(fmt: str, quantize, dequantize, cases: str) -> None:
    for seed, case in enumerate(_plan(BLOCK_CASES, cases)):
        base = weights(case.kind, case.shape[::-1] if case.transposed else case.shape, 70 + seed, fmt)
        for name in case.dtypes:
            w = base.to(memfit.DEVICE, DTYPES[name])
            w = w.t() if case.transposed else w
            _check_block_one(fmt, quantize, dequantize, w, case.kind, ", a transposed view" if case.transposed else "")
    for case in _plan(BLOCK_MEMORY_CASES, cases):
        _block_memory(fmt, quantize, dequantize, case)
    for case in _plan(BLOCK_INVALID_CASES, cases):
        _block_invalid(fmt, quantize, dequantize, case)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            w, view = _drawn_block_tensor(fmt, d)
            _check_block_one(fmt, quantize, dequantize, w, d["weights"], view)
        grade_drawn(block_domain(), fmt, DRAWN_BLOCK_CASES, check_one)


def check_q8_0(quantize_q8_0, dequantize_q8_0, cases: str = "visible") -> None:
    _check_block_format("q8_0", quantize_q8_0, dequantize_q8_0, cases)


def check_q4_0(quantize_q4_0, dequantize_q4_0, cases: str = "visible") -> None:
    _check_block_format("q4_0", quantize_q4_0, dequantize_q4_0, cases)


# ------------------------------------------------------------------------------------- int8 matmul

def reference_q8_0(w: torch.Tensor):
    """The check's own Q8_0 of w (llama.cpp's), as a Quantized (the lesson's given container)."""
    ref = llama_quantize("q8_0", w)
    return _given().Quantized("q8_0", ref.codes.to(torch.int8).to(w.device), ref.scales.to(w.device), w.shape,
                              w.dtype)


def _round_to_tf32(a):
    """numpy fp32 values rounded to TF32's 10-bit mantissa (to nearest, ties away), as a tensor core reads them."""
    import numpy as np
    bits = np.ascontiguousarray(a).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@contextlib.contextmanager
def _tf32_like_a_gpu():
    """On Triton's interpreter, a tl.dot of fp32 tiles left at the default input_precision ("tf32") rounds its
    inputs to TF32, as a GPU's tensor cores do (the interpreter alone would compute it in full fp32)."""
    if memfit.HAS_GPU:
        yield
        return
    from triton._C.libtriton import ir
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and str(a.data.dtype) == "float32" \
                and str(b.data.dtype) == "float32":
            a = interpreter.TensorHandle(_round_to_tf32(a.data), a.dtype)
            b = interpreter.TensorHandle(_round_to_tf32(b.data), b.dtype)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = original


INT8_VARIANTS = tuple(name for _, name in lesson.INT8_MATMUL_CLASSES)  # the tile classes of M, decoding to prefill


def _block_k(m: int) -> int:
    return lesson.int8_matmul_tiles(m)["BLOCK_K"]


@dataclass(frozen=True)
class MatmulCase:
    lead: tuple  # x's leading dimensions: x is (*lead, K)
    n: int
    k: int
    dtypes: str  # "all" (the profile's), "fp32" or "half" (the profile's 16-bit ones)
    hidden: bool
    layout: str = "contiguous"  # or "column slice" (rows strided wider than K) or "transposed" (stride(-1) != 1)
    gpu_only: bool = False
    values: str = "heavy-tailed"  # or "cancelling partial sums": the halves of K nearly cancel (see _cancelling)

    @property
    def m(self) -> int:
        return math.prod(self.lead)

    def dtype_names(self) -> tuple:
        if self.dtypes == "all":
            return PROFILE_DTYPES
        return ("fp32",) if self.dtypes == "fp32" else tuple(d for d in PROFILE_DTYPES if d != "fp32")

    def axes(self) -> dict:
        return {"dtype": self.dtype_names(), "x_rank": len(self.lead) + 1, "x_layout": self.layout,
                "tiles": lesson.int8_matmul_variant(self.m), "values": self.values,
                "k_vs_block_k": "a multiple of BLOCK_K" if self.k % _block_k(self.m) == 0 else "ragged"}


MATMUL_CASES = [
    MatmulCase((17,), 40, 96, "all", False),
    MatmulCase((), 64, 64, "half", False),
    MatmulCase((2, 32), 130, 320, "fp32", False),
    MatmulCase((5,), 33, 32, "fp32", False, layout="column slice"),
    MatmulCase((20,), 48, 512, "half", False, layout="transposed"),
    MatmulCase((2, 50), 24, 96, "fp32", False),  # the tile classes of 100 and 300 rows, on a CPU too
    MatmulCase((300,), 40, 64, "half", False),
    MatmulCase((16,), 40, 128, "half", False, values="cancelling partial sums"),
    MatmulCase((33,), 24, 256, "half", True, values="cancelling partial sums"),
    MatmulCase((5,), 33, 32, "all", True),
    MatmulCase((70,), 100, 512, "fp32", True),
    MatmulCase((3, 11), 257, 160, "half", True),
    MatmulCase((), 40, 96, "fp32", True),
    MatmulCase((9,), 24, 64, "half", True, layout="column slice"),
    MatmulCase((40,), 20, 96, "fp32", True, layout="transposed"),
    MatmulCase((260,), 24, 64, "fp32", True),  # prefill's tiles, on a CPU too
    MatmulCase((16,), 4096, 4096, "all", True, gpu_only=True),
    MatmulCase((300,), 1000, 2048, "all", True, gpu_only=True),
]


@dataclass(frozen=True)
class MatmulInvalidCase:
    invalid: str  # K mismatch, int x, other format, K not a multiple of 32
    hidden: bool
    gpu_only: bool = False

    def axes(self) -> dict:
        return {"invalid": self.invalid}


MATMUL_INVALID_CASES = [MatmulInvalidCase(kind, hidden) for hidden in (False, True)
                        for kind in ("K mismatch", "int x", "other format", "K not a multiple of 32")]


def _x_for(case: MatmulCase, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = seeded_generator(seed)
    shape = (*case.lead, case.k)
    if case.layout == "column slice":  # rows of a wider tensor: stride(-2) = K + 32
        return torch.randn(*case.lead, case.k + 32, generator=gen).to(memfit.DEVICE, dtype)[..., :case.k]
    if case.layout == "transposed":  # x[i, j] at j * M + i
        return torch.randn(case.k, case.m, generator=gen).to(memfit.DEVICE, dtype).t()
    return torch.randn(*shape, generator=gen).to(memfit.DEVICE, dtype)


def _matmul_invalid(int8_weight_matmul, case: MatmulInvalidCase) -> None:
    k = 96 if case.hidden else 64
    x = torch.randn(4, k, device=memfit.DEVICE)
    qw = reference_q8_0(weights("gaussian", (8, k), 1).to(memfit.DEVICE))
    if case.invalid == "K mismatch":
        expect_value_error(int8_weight_matmul, x[:, :k - 16], qw, what=f"int8_weight_matmul with x of {k - 16} "
                           f"features and a weight of {k}", why="naming the shapes")
    elif case.invalid == "int x":
        bad = x.long() if case.hidden else x.int()
        expect_value_error(int8_weight_matmul, bad, qw, what=f"int8_weight_matmul with an {_name(bad.dtype)} x",
                           why="naming the dtype")
    elif case.invalid == "other format":
        q4 = _given().Quantized("q4_0", torch.zeros(qw.scales.numel(), 16, dtype=torch.uint8, device=memfit.DEVICE),
                                qw.scales, qw.shape, qw.dtype)
        expect_value_error(int8_weight_matmul, x, q4, what="int8_weight_matmul with a Q4_0 weight",
                           why="naming the format")
    else:
        odd_k = 80 if case.hidden else 48
        odd = reference_q8_0(weights("gaussian", (32, odd_k), 2).to(memfit.DEVICE))
        expect_value_error(int8_weight_matmul, torch.randn(4, odd_k, device=memfit.DEVICE), odd,
                           what=f"int8_weight_matmul with in_features={odd_k}",
                           why="saying K must be a multiple of 32")


def _cancelling(case: MatmulCase, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, w) on the CPU in fp32 whose products over K's second half nearly cancel those over its first: x = [v, v]
    x 100, w's second half = -(its first half) + noise of 2e-4. Each half's sum is about 100x the result, so
    partial sums rounded to 16 bits (split K added in x's dtype) or a tile of Ŵ not rounded to x's dtype (a product
    other than dequantize-then-matmul's) move the result by several times the tolerance; fp32 accumulation of the
    rounded tile, as the text asks, stays well within it."""
    gen = seeded_generator(seed)
    half = case.k // 2
    w = weights("heavy", (case.n, case.k), seed)
    w[:, half:] = -w[:, :half] + 2e-4 * torch.randn(case.n, half, generator=gen)
    v = torch.randn(case.m, half, generator=gen)
    return torch.cat([v, v], dim=1).reshape(*case.lead, case.k) * 100, w


def _matmul_hint(y, exact, dtype, case: MatmulCase) -> str:
    """What a failed matmul's error looks like, where it has a known shape."""
    if not isinstance(y, torch.Tensor) or y.shape != exact.shape:  # (the failure already says what is wrong)
        return ""
    rel = ((y.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30)).item()
    if dtype == torch.float32 and 1e-5 < rel < 1e-2:
        return (f" (relative error {rel:.1e}: about TF32's 10-bit precision; in fp32 pass "
                "input_precision=\"ieee\" to tl.dot)")
    if case.values == "cancelling partial sums":
        return (" (the two halves of K nearly cancel here: accumulate in fp32, add split-K partial sums in an fp32 y, "
                "and round each dequantized tile to x's dtype before tl.dot, as dequantize-then-matmul would)")
    return ""


def check_int8_matmul(int8_weight_matmul, cases: str = "visible") -> None:
    for seed, case in enumerate(_plan(MATMUL_CASES, cases)):
        for name in case.dtype_names():
            _matmul_case(int8_weight_matmul, case, DTYPES[name], seed)
    for case in _plan(MATMUL_INVALID_CASES, cases):
        _matmul_invalid(int8_weight_matmul, case)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            lead = (d["m"],) if d["x_rank"] == 2 else () if d["x_rank"] == 1 else (d["m"], 2)
            if d["x_rank"] == 1 and d["layout"] != "contiguous":
                raise Impossible()  # a vector has no rows to lay out apart
            layout = "contiguous" if d["values"] == "cancelling partial sums" else d["layout"]  # (built contiguous)
            case = MatmulCase(lead, d["n"], 32 * d["k_blocks"], d["dtype"], True, layout, values=d["values"])
            _matmul_case(int8_weight_matmul, case, DTYPES[d["dtype"]], d["seed"])
        grade_drawn(matmul_domain(), "int8_matmul", DRAWN_MATMUL_CASES, check_one)


def matmul_domain() -> dict:
    """Every call the text allows: x of rank 1 to 3 with any number of rows (each of int8_matmul_tiles's classes),
    contiguous or not, K any multiple of Q8_0's 32 (ragged against BLOCK_K too), any N, each dtype."""
    return {"m": Sizes(1, 300, edges=(1, 16, 17, 64, 65, 256, 257)), "x_rank": Choice(2, 1, 3),
            "n": Sizes(1, 160, edges=(1, 16, 17)), "k_blocks": Sizes(1, 12, edges=(1, 2, 3)),
            "dtype": Choice(*PROFILE_DTYPES), "layout": Choice("contiguous", "column slice", "transposed"),
            "values": Choice("heavy-tailed", "cancelling partial sums")}


DRAWN_MATMUL_CASES = 4


def _matmul_case(int8_weight_matmul, case: MatmulCase, dtype: torch.dtype, seed: int) -> None:
    if case.values == "cancelling partial sums":
        x, w = (t.to(memfit.DEVICE, dtype) for t in _cancelling(case, 91 + seed))
    else:
        x = _x_for(case, dtype, 90 + seed)
        w = weights("heavy", (case.n, case.k), 91 + seed).to(memfit.DEVICE, dtype)
    qw = reference_q8_0(w)
    w_hat = decode("q8_0", qw.data.cpu(), qw.scales.cpu(), case.n * case.k).view(case.n, case.k)
    w_hat = w_hat.to(memfit.DEVICE, dtype)
    view = "" if case.layout == "contiguous" else f", a {case.layout} view"
    values = "" if case.values == "heavy-tailed" else f", {case.values} (K's halves)"
    tiles = lesson.int8_matmul_tiles(case.m)
    what = (f"int8_weight_matmul(x of shape {tuple(x.shape)}{view}, {_name(dtype)}; weight {case.n} x "
            f"{case.k} in Q8_0{values}; int8_matmul_tiles gives BLOCK_K {tiles['BLOCK_K']}, "
            f"SPLIT_K {tiles['SPLIT_K']})")
    with guarded_allocations(what), _tf32_like_a_gpu():
        y = _call_pure_q(int8_weight_matmul, x, qw, what=what)
    exact = x.double() @ w_hat.double().T
    same = x @ w_hat.T
    floor = 4 * math.sqrt(case.k) if dtype == torch.float32 else 4.0
    # any order of the K products' fp32 sum keeps the points (split-K's slices too), where the halves cancel as well
    bound = summation_bound(x.double().abs() @ w_hat.double().abs().T, case.k + 2, torch.float32)
    try:
        assert_close_by_rule(y, exact, same, what, floor_ulps=floor, bound=bound)
    except CheckFailed as failed:
        raise CheckFailed(str(failed) + _matmul_hint(y, exact, dtype, case)) from None


@dataclass(frozen=True)
class MatmulMemoryCase:
    m: int
    n: int
    k: int
    dtype: str
    hidden: bool
    gpu_only: bool = False
    cpu_only: bool = False

    def axes(self) -> dict:
        return {"dtype": self.dtype, "tiles": lesson.int8_matmul_variant(self.m), "kept": "after the call"}


MATMUL_MEMORY_CASES = [
    # on the CPU, run once by both parts (hidden=None): the interpreter is slow, the meter's collections too
    MatmulMemoryCase(16, 256, 512, "fp32", None, cpu_only=True),
    MatmulMemoryCase(40, 96, 512, "fp16", None, cpu_only=True),
    MatmulMemoryCase(100, 64, 256, "fp32", None, cpu_only=True),
    MatmulMemoryCase(260, 32, 576, "fp16", None, cpu_only=True),  # K > 2M: the output stays under half of Ŵ
] + [MatmulMemoryCase(m, n, k, dtype, hidden, gpu_only=True)
     for m, n, k, dtype, hidden in ((16, 14336, 4096, "fp16", False), (64, 4096, 4096, "fp32", False),
                                    (48, 4096, 4096, "bf16", False), (1, 4096, 14336, "fp16", True),
                                    (300, 2048, 4096, "fp32", True), (8, 4096, 2048, "bf16", True),
                                    (128, 4096, 4096, "fp16", True))
     if dtype in PROFILE_DTYPES]


def check_int8_matmul_memory(int8_weight_matmul, cases: str = "visible") -> None:
    for case in _plan(MATMUL_MEMORY_CASES, cases):
        if case.cpu_only and memfit.HAS_GPU:
            continue
        _matmul_memory_case(int8_weight_matmul, case.m, case.n, case.k, DTYPES[case.dtype])
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            k = 32 * d["k_blocks"]
            if 2 * d["m"] >= k:
                raise Impossible()  # the output would be half of Ŵ's size: nothing to tell a copy of Ŵ by
            _matmul_memory_case(int8_weight_matmul, d["m"], d["n"], k, DTYPES[d["dtype"]])
        grade_drawn(MATMUL_MEMORY_DOMAIN, "int8_matmul_memory", DRAWN_MATMUL_MEMORY_CASES, check_one)


# Every size a CPU measures in seconds where the output is under half the dequantized weight (M < K / 2).
MATMUL_MEMORY_DOMAIN = {"m": Sizes(1, 280, edges=(1, 16, 17, 65, 257)), "n": Sizes(32, 256, edges=(32,)),
                        "k_blocks": Sizes(8, 18, edges=(8,)), "dtype": Choice(*PROFILE_DTYPES)}
DRAWN_MATMUL_MEMORY_CASES = 2


def _matmul_memory_case(int8_weight_matmul, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    gen = seeded_generator(m + n)
    x = torch.randn(m, k, generator=gen).to(memfit.DEVICE, dtype)
    qw = reference_q8_0(weights("gaussian", (n, k), n).to(memfit.DEVICE, dtype))
    what = f"int8_weight_matmul(M={m}, N={n}, K={k}, {_name(dtype)})"
    _, report = measure_peak(lambda: call_learner(int8_weight_matmul, x, qw, what=what), device=memfit.DEVICE,
                             warmup=memfit.HAS_GPU)  # live meter: what the call caches counts as kept
    w_hat_bytes = n * k * x.element_size()
    out_bytes = m * n * x.element_size()
    if report.largest_bytes is not None and report.largest_bytes >= w_hat_bytes // 2:
        raise CheckFailed(f"{what}: a tensor of {format_bytes(report.largest_bytes)} existed during the call; the "
                          f"dequantized weight is {format_bytes(w_hat_bytes)}: dequantize tiles in the kernel")
    if report.largest_bytes is None and report.peak_bytes >= w_hat_bytes // 2:  # the CUDA meter sees totals only
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} during the call is at least "
                          f"half the dequantized weight ({format_bytes(w_hat_bytes)}): dequantize tiles in the "
                          "kernel; no Ŵ, nor half of it, may exist at once")
    # the text forbids a tensor the size of Ŵ; small copies (fp32 scales: an eighth of an fp32 Ŵ) are allowed
    allowed = int(1.05 * out_bytes) + max(64 << 10, w_hat_bytes // 8)
    if report.peak_bytes > allowed:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds the output "
                          f"({format_bytes(out_bytes)}) + 5% + {format_bytes(allowed - int(1.05 * out_bytes))} "
                          f"(an eighth of the dequantized weight, which would be {format_bytes(w_hat_bytes)})")
    if report.kept_bytes > KEPT_SLACK:
        raise CheckFailed(f"{what}: {format_bytes(report.kept_bytes)} stayed allocated after the call, beyond its "
                          f"result (a dequantized weight is {format_bytes(w_hat_bytes)}): a cache of Ŵ is a copy "
                          "of Ŵ; the call may keep nothing")
    if report.meter == LIVE_TENSORS:
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
        zero = " (a block of zeros: absmax 0, every value the level 0)" if ref_absmax[i // block] == 0 else ""
        raise CheckFailed(f"{what}: value {i} / its block's absmax is {r[i].item():.6g}{zero}; its code stands for "
                          f"{levels[i].item():.6g}, but the level {_nearest_level(code, r[i:i + 1]).item():.6g} is "
                          "nearer: store the index of the nearest level")


@dataclass(frozen=True)
class BlockwiseCase:
    kind: str  # heavy, gaussian, blocky, zeros
    shape: tuple
    signed: bool
    dtype: str  # x's dtype
    hidden: bool
    block: int | None = None  # None: the default (STATE_BLOCK), not passed
    gpu_only: bool = False

    def axes(self) -> dict:
        block = self.block or 256
        values = {"heavy": "heavy-tailed", "gaussian": "gaussian", "blocky": "zero block", "zeros": "zero block"}
        return {"code": "signed (m)" if self.signed else "unsigned (v)", "values": values[self.kind],
                "n_vs_block": _n_vs_block(math.prod(self.shape), block), "rank": len(self.shape),
                "block": "default" if self.block is None else "other", "dtype": self.dtype}


BLOCKWISE_CASES = [
    BlockwiseCase("heavy", (1000,), True, "fp32", False),
    BlockwiseCase("gaussian", (256,), False, "fp32", False),
    BlockwiseCase("blocky", (2, 5, 30), True, "fp16", False, block=64),
    BlockwiseCase("zeros", (300,), False, "fp32", False),
    BlockwiseCase("gaussian", (1,), True, "fp32", False),
    BlockwiseCase("heavy", (1100,), False, "fp32", False, block=512),  # 2 blocks and a partial: block=512 shows
] + [BlockwiseCase("heavy", (2, 100), True, name, False) for name in PROFILE_DTYPES if name != "fp32"] + [
    BlockwiseCase("gaussian", (1,), False, "fp32", True),
    BlockwiseCase("zeros", (512,), True, "fp32", True),
    BlockwiseCase("heavy", (70_001,), False, "fp32", True),
    BlockwiseCase("heavy", (255,), True, "fp32", True),
    BlockwiseCase("blocky", (257,), False, "fp32", True),
    BlockwiseCase("heavy", (3, 7, 50), True, "fp32", True, block=128),
    BlockwiseCase("gaussian", (40, 32), False, "fp32", True, block=1024),
] + [BlockwiseCase("blocky", (600,), False, name, True, block=64) for name in PROFILE_DTYPES if name != "fp32"]


def blockwise_domain() -> dict:
    """Every call exercise 4 allows: lengths of whole blocks, one over or under, or half a block more, with the default
    block or another, 1 to 3 dimensions, both codes, each kind of values of BLOCKWISE_CASES, fp32, fp16 and bf16."""
    return {"blocks": Sizes(0, 40, edges=(0, 1, 2)), "beyond": Choice(0, 1, -1, "half a block"),
            "block": Choice(None, 64, 1024, 32, 128, 512), "rank": Choice(1, 2, 3),
            "values": Choice("gaussian", "heavy", "blocky", "zeros"), "signed": Choice(True, False),
            "dtype": Choice(*(NAMES[d] for d in ALL_DTYPES))}


def _factored(n: int, rank: int) -> tuple:
    """A shape of `rank` dimensions holding n values (the leading ones the largest divisors up to the root)."""
    shape = []
    for _ in range(rank - 1):
        shape.append(next(f for f in range(math.isqrt(n), 0, -1) if n % f == 0))
        n //= shape[-1]
    return (*shape, n)


DRAWN_BLOCKWISE_CASES = 5


def check_blockwise(quantize_blockwise, dequantize_blockwise, cases: str = "visible") -> None:
    for seed, case in enumerate(_plan(BLOCKWISE_CASES, cases)):
        _check_blockwise_case(quantize_blockwise, dequantize_blockwise, case, 120 + seed)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            block = d["block"] or 256
            n = d["blocks"] * block + (block // 2 if d["beyond"] == "half a block" else d["beyond"])
            if n < 1:
                raise Impossible()
            case = BlockwiseCase(d["values"], _factored(n, d["rank"]), d["signed"], d["dtype"], True, d["block"])
            _check_blockwise_case(quantize_blockwise, dequantize_blockwise, case, d["seed"])
        grade_drawn(blockwise_domain(), "blockwise", DRAWN_BLOCKWISE_CASES, check_one)


def _check_blockwise_case(quantize_blockwise, dequantize_blockwise, case: BlockwiseCase, seed: int) -> None:
    code = _given().dynamic_code(case.signed).to(memfit.DEVICE)
    x = weights(case.kind, case.shape, seed)
    if not case.signed:
        x = x * x * 100  # v: squares of gradients, many orders of magnitude
    x = x.to(memfit.DEVICE, DTYPES[case.dtype])
    block = case.block or 256
    extra = {} if case.block is None else {"block": case.block}
    n = x.numel()
    args = f"{case.kind} values of shape {tuple(x.shape)}, {_name(x.dtype)}, " \
           f"{'signed' if case.signed else 'unsigned'} code{'' if case.block is None else f', block={case.block}'}"
    what = f"quantize_blockwise({args})"
    got = call_pure(quantize_blockwise, x, code, what=what, **extra)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return (codes, absmax), got {type(got).__name__}")
    codes, absmax = got
    _check_state_codes(codes, absmax, x.double().cpu().reshape(-1), code.cpu(), what, block)
    if codes.shape != (n,) or absmax.dim() != 1:  # the text: flattened, whatever x's shape
        raise CheckFailed(f"{what}: codes should be flat, of shape ({n},), and absmax one value per block, 1-D; got "
                          f"codes of shape {tuple(codes.shape)}, absmax of shape {tuple(absmax.shape)}")
    what = f"dequantize_blockwise(the codes and absmax of {args})"
    values = call_pure(dequantize_blockwise, codes, absmax, code, what=what, **extra)
    exact = code.cpu().double()[codes.cpu().reshape(-1).long()] * \
        absmax.double().cpu().repeat_interleave(block)[:n]
    if not isinstance(values, torch.Tensor) or values.dtype != torch.float32 or values.shape != (n,):
        raise CheckFailed(f"{what}: should return {n} fp32 values, flattened (shape ({n},)), got "
                          f"{getattr(values, 'dtype', type(values).__name__)} of shape "
                          f"{tuple(getattr(values, 'shape', ()))}")
    err = (values.detach().double().cpu().reshape(-1) - exact).abs()
    if (err > 1e-6 * exact.abs() + 1e-30).any():
        i = int(err.argmax())
        raise CheckFailed(f"{what}: value {i} is {values.reshape(-1)[i].item():.6g}, expected code[codes] x absmax "
                          f"= {exact[i].item():.6g} (a uint8 index tensor is a mask, not a gather: .long() it)")


# --------------------------------------------------------------------------------------- AdamW8bit

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _def_line_hyper() -> dict:
    """lr, betas, eps and weight_decay as the exercise's def line gives them (the reference's signature)."""
    parameters = inspect.signature(lesson.AdamW8bit.__init__).parameters
    return {k: parameters[k].default for k in HYPER}


def _graded_alone(AdamW8bit):
    """AdamW8bit graded on its own: the quantize_blockwise / dequantize_blockwise it calls are the reference's."""
    return given_references(AdamW8bit, quantize_blockwise=lesson.quantize_blockwise,
                            dequantize_blockwise=lesson.dequantize_blockwise)


def _problem(seed: int, big=(300, 70), small=(50,)):
    gen = seeded_generator(seed)
    return [(torch.randn(big, generator=gen) * 0.1), (torch.randn(small, generator=gen) * 0.1)], gen


def _gradient(p: torch.Tensor, step: int, scale: float = 10.0) -> torch.Tensor:
    g = weights("heavy", tuple(p.shape), 1000 * step + p.numel()) * scale
    if step == 1 and p.numel() > 512:
        g.view(-1)[:256] = 0  # a block of zeros: absmax 0
    return g


def _simulate(params, steps: int, code_m, code_v, block=256, min_8bit=4096, scale=10.0, hyper=None):
    """The check's float64 run of the algorithm (nearest levels, fp32-free): params after `steps` steps."""
    hyper = hyper or HYPER
    lr, (b1, b2), eps, wd = hyper["lr"], hyper["betas"], hyper["eps"], hyper["weight_decay"]
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
            g = _gradient(params[i], t, scale).double()
            p.mul_(1 - lr * wd)
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            p.sub_(lr * (ms[i] / (1 - b1**t)) / ((vs[i] / (1 - b2**t)).sqrt() + eps))
            if p.numel() >= min_8bit:
                ms[i], vs[i] = rounded(ms[i], code_m), rounded(vs[i], code_v)
    return ps, ms, vs


def _learner_run(AdamW8bit, params, steps: int, what: str, scale: float = 10.0, defaults: bool = False, **extra):
    """defaults: construct with no lr, betas, eps or weight_decay (the def line's are the right ones)."""
    leaves = [p.clone().to(memfit.DEVICE).requires_grad_(True) for p in params]
    hyper = {} if defaults else HYPER
    options = ", ".join(([str(HYPER)] if hyper else ["the def line's lr, betas, eps and weight_decay"])
                        + [f"{k}={v}" for k, v in extra.items()])
    opt = call_learner(AdamW8bit, leaves, **hyper, what=f"AdamW8bit(params, {options})", **extra)
    for t in range(1, steps + 1):
        grads = []
        for p in leaves:
            p.grad = _gradient(p.detach().cpu(), t, scale).to(memfit.DEVICE)
            grads.append(p.grad.clone())
        call_learner(opt.step, what=f"{what}, step {t}")
        for p, g in zip(leaves, grads):
            if p.grad is None or not torch.equal(p.grad, g):
                raise CheckFailed(f"{what}, step {t}: the step changed a parameter's .grad: read the gradient, never "
                                  "write it (g * g, not g.mul_(g); .float() of an fp32 tensor is the tensor itself)")
    return leaves, opt


@dataclass(frozen=True)
class AdamCase:
    big: tuple  # the 8-bit weight's shape
    small: tuple  # the fp32-state weight's shape
    chunk: int | None  # None: the default chunk (one chunk here)
    grad_scale: float  # 10: heavy-tailed gradients; 1e-5: |g| near eps, where eps's place in the formula shows
    hidden: bool
    gpu_only: bool = False
    defaults: bool = False  # constructed without lr, betas, eps, weight_decay: the def line's must be the ones used

    def hyper(self) -> dict:
        return _def_line_hyper() if self.defaults else HYPER

    def axes(self) -> dict:
        n = math.prod(self.big)
        chunks = "one (the default)" if self.chunk is None else \
            ("several, a partial last" if n % self.chunk else "several, whole")
        return {"path": ("8-bit", "fp32"), "chunks": chunks, "steps": (1, 8), "param_rank": (len(self.big), len(self.small)),
                "gradients": "heavy-tailed" if self.grad_scale >= 1 else "tiny (|g| near eps)",
                "grad_zero_block": True, "grads_unchanged": True,
                "hyperparameters": "the def line's defaults" if self.defaults else "passed"}


ADAM_CASES = [AdamCase((300, 70), (50,), None, 10.0, False), AdamCase((70, 80), (7, 5), 1024, 1e-5, False),
              AdamCase((64, 80), (9,), None, 10.0, False, defaults=True),
              AdamCase((257, 33), (7, 5), None, 1e-5, True), AdamCase((9000,), (50, 3), 2048, 10.0, True),
              AdamCase((33, 257), (5,), 512, 10.0, True, defaults=True)]


@dataclass(frozen=True)
class AdamMemoryCase:
    numel: int
    chunk: int
    hidden: bool
    gpu_only: bool = False

    def axes(self) -> dict:
        return {"memory": f"chunk={self.chunk}", "kept": "after the step"}


ADAM_MEMORY_CASES = [AdamMemoryCase((1 << 18) + 300, 4096, None)]  # a partial last chunk; run once by both parts


def _adam_case(AdamW8bit, case: AdamCase, seed: int) -> None:
    given = _given()
    code_m, code_v = given.dynamic_code(True), given.dynamic_code(False)
    params, _ = _problem(140 + seed, case.big, case.small)
    extra = {} if case.chunk is None else {"chunk": case.chunk}
    chunk = "" if case.chunk is None else f", chunk={case.chunk}"
    size = "" if case.grad_scale >= 1 else ", gradients of about 1e-5"
    hyper = case.hyper()
    what = (f"AdamW8bit{chunk}{', its default hyperparameters' if case.defaults else ''} on a {case.big} weight "
            f"(8-bit states) and a {case.small} one (fp32 states){size}")
    leaves, opt = _learner_run(AdamW8bit, params, 1, what, case.grad_scale, case.defaults, **extra)
    exact, _, _ = _simulate(params, 1, code_m, code_v, scale=case.grad_scale, hyper=hyper)
    same = [p.clone().requires_grad_(True) for p in params]
    torch_opt = torch.optim.AdamW(same, foreach=False, **hyper)
    for p in same:
        p.grad = _gradient(p.detach(), 1, case.grad_scale)
    torch_opt.step()
    for name, got, e, s in zip(("the 8-bit weight", "the fp32-state weight"), leaves, exact, same):
        assert_close_by_rule(got.detach().cpu(), e, s.detach(), f"{what}: {name} after step 1 (the update uses "
                             "the fp32 m and v, before they are rounded)", floor_ulps=4)
    state = opt.state[leaves[0]]
    for key, code in (("m", code_m), ("v", code_v)):
        if key not in state or key + "_absmax" not in state:
            raise CheckFailed(f"{what}: the 8-bit weight's state should hold {key!r} and {key + '_absmax'!r} "
                              f"(the given _state creates them); it has {sorted(state)}")
        g = _gradient(params[0], 1, case.grad_scale).double()
        exact_state = (1 - hyper["betas"][0]) * g if key == "m" else (1 - hyper["betas"][1]) * g ** 2
        _check_state_codes(state[key], state[key + "_absmax"], exact_state.reshape(-1), code,
                           f"{what}: state[{key!r}] after step 1 (on the {'signed' if key == 'm' else 'unsigned'} "
                           "code)")
    n = leaves[0].numel()
    state_bytes = sum(t.numel() * t.element_size() for k, t in state.items() if isinstance(t, torch.Tensor))
    allowed = 2 * (n + 4 * math.ceil(n / 256)) + 64
    if state_bytes > allowed:
        raise CheckFailed(f"{what}: the 8-bit weight's states take {state_bytes:,} bytes for {n:,} values "
                          f"({state_bytes / n:.2f} B/param); 8-bit m and v with fp32 absmax per 256 are "
                          f"{allowed - 64:,} ({(allowed - 64) / n:.3f} B/param)")
    steps = 8
    leaves, _ = _learner_run(AdamW8bit, params, steps, what, case.grad_scale, case.defaults, **extra)
    exact, _, _ = _simulate(params, steps, code_m, code_v, scale=case.grad_scale, hyper=hyper)
    diffs = torch.cat([(got.detach().cpu().double() - e).abs().flatten() for got, e in zip(leaves, exact)])
    allowed_drift = 0.01 * hyper["lr"] * steps
    # A state whose fp64 value lies within fp32's rounding of a midpoint between two levels may round to the other
    # level in any right answer (the reference too, on some draws of the gradients): that weight then takes another
    # path. Such flips are isolated; storing states into the wrong codes or blocks moves most weights.
    off, isolated = int((diffs > allowed_drift).sum()), max(1, diffs.numel() // 1000)
    if off > isolated:
        raise CheckFailed(f"{what}: after {steps} steps {off:,} of {diffs.numel():,} weights are farther than "
                          f"{allowed_drift:.3g} from the same algorithm run in float64, up to {diffs.max().item():.3g} "
                          f"(allowed: {isolated:,}, the few whose state rounds to the other side of a level's midpoint): "
                          "store the updated m and v back, into the chunk's own codes and the absmax of the chunk's "
                          "own blocks")


def _adam_memory(AdamW8bit, case: AdamMemoryCase) -> None:
    numel, chunk = case.numel, case.chunk
    p = torch.zeros(numel, device=memfit.DEVICE, requires_grad=True)
    opt = call_learner(AdamW8bit, [p], lr=1e-3, chunk=chunk, what=f"AdamW8bit([p], lr=1e-3, chunk={chunk})")
    p.grad = torch.randn(numel, device=memfit.DEVICE)
    call_learner(opt.step, what="AdamW8bit.step")  # the states exist after the first step
    what = f"AdamW8bit(chunk={chunk}).step() on {numel:,} parameters"
    _, report = measure_peak(lambda: call_learner(opt.step, what=what), device=memfit.DEVICE, warmup=False)
    if report.peak_bytes > numel:
        raise CheckFailed(f"{what}: the step allocated {format_bytes(report.peak_bytes)} at its peak, over 1 byte "
                          f"per parameter ({format_bytes(numel)}; m alone in fp32 is {format_bytes(4 * numel)}): "
                          "dequantize, update and requantize one chunk at a time")
    if report.kept_bytes > KEPT_SLACK:
        raise CheckFailed(f"{what}: {format_bytes(report.kept_bytes)} stayed allocated after the step (the states "
                          "existed before it): keep nothing but the states")


def check_adamw8bit_step(AdamW8bit, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    with _graded_alone(AdamW8bit):
        for seed, case in enumerate(_plan(ADAM_CASES, cases)):
            _adam_case(AdamW8bit, case, seed)
        for case in _plan(ADAM_MEMORY_CASES, cases):
            _adam_memory(AdamW8bit, case)
    if hidden:
        def check_one(d: dict) -> None:
            rows = d["big_rows"]
            cols = max(d["big_cols"], -(-MIN_8BIT // rows))  # at least min_8bit_size values: 8-bit states
            big = (rows * cols,) if d["big_rank"] == 1 else (rows, cols)
            small = (d["small"],) if d["small_rank"] == 1 else (d["small"], 3)
            with _graded_alone(AdamW8bit):
                _adam_case(AdamW8bit, AdamCase(big, small, d["chunk"], d["gradients"], True,
                                               defaults=d["hyperparameters"] == "the def line's"), d["seed"])
        grade_drawn(adam_domain(), "adamw8bit_step", DRAWN_ADAM_CASES, check_one)
    p = torch.zeros(1 << 12, device=memfit.DEVICE, requires_grad=True)
    for chunk in ((1000,) if visible else ()) + ((4095, 0) if hidden else ()):
        expect_value_error(AdamW8bit, [p], 1e-3, (0.9, 0.999), 1e-8, 0.0, 4096, chunk,
                           what=f"AdamW8bit(..., chunk={chunk})", why="saying chunk must be a positive multiple of 256")


MIN_8BIT = 4096  # the def line's min_8bit_size


def adam_domain() -> dict:
    """Every step the text allows: an 8-bit-state weight of rank 1 or 2 and any size from min_8bit_size up, beside an
    fp32-state one, in one chunk or in chunks of any multiple of 256 (a partial last one too), gradients heavy-tailed,
    ordinary or near eps, hyperparameters passed or the def line's."""
    return {"big_rows": Sizes(1, 200, edges=(1, 64)), "big_cols": Sizes(1, 400, edges=(1, 257)),
            "big_rank": Choice(2, 1), "small": Sizes(1, 60, edges=(1,)), "small_rank": Choice(1, 2),
            "chunk": Choice(None, 256, 512, 768, 4096), "gradients": Choice(10.0, 1.0, 1e-5),
            "hyperparameters": Choice("passed", "the def line's")}


DRAWN_ADAM_CASES = 4


# Two runs of the course's tiny GPT on the Markov corpus: AdamW (fp32 states) and the learner's AdamW8bit.
# The margin: every 20-step mean within 2% of AdamW's (the reference's largest gap on a CPU: 0.3%). The grader runs
# all the steps; the notebook's visible check the first visible_steps of the same runs (the runs are deterministic).
CONVERGENCE = dict(steps=200, visible_steps=60, lr=3e-3, batch=8, seq=64, window=20, margin=0.02)


def check_adamw8bit_convergence(AdamW8bit, cases: str = "visible") -> dict:
    """Returns the two loss curves it compared: {"AdamW (fp32 states)": [...], "AdamW8bit": [...]}."""
    from memfit.gpt import COURSE_CONFIGS
    from memfit.training import loss_curve
    _, hidden = check_cases(cases)
    c = CONVERGENCE
    steps = c["steps"] if hidden else c["visible_steps"]
    cfg = COURSE_CONFIGS["tiny"]

    def run(make):
        return loss_curve(cfg, make, steps, c["batch"], c["seq"], device=memfit.DEVICE)  # minutes on a CPU: seconds there

    with _graded_alone(AdamW8bit):
        ours = call_learner(run, lambda params: AdamW8bit(params, lr=c["lr"], weight_decay=0.1),
                            what=f"training course-tiny with AdamW8bit(params, lr={c['lr']}, weight_decay=0.1)")
    if not all(math.isfinite(x) for x in ours):
        first = next(i for i, x in enumerate(ours) if not math.isfinite(x))
        raise CheckFailed(f"AdamW8bit training course-tiny: the loss became {ours[first]} at step {first}")
    key = sorted({**{k: v for k, v in c.items() if k != "visible_steps"}, "steps": steps}.items())
    fp32 = reference(f"adamw8bit_convergence torch.optim.AdamW {key}",
                     lambda: run(lambda params: torch.optim.AdamW(params, lr=c["lr"], weight_decay=0.1)))
    w = c["window"]
    for start in range(0, steps, w):
        a, b = sum(ours[start:start + w]) / w, sum(fp32[start:start + w]) / w
        if abs(a - b) > c["margin"] * b:
            raise CheckFailed(f"AdamW8bit training course-tiny ({steps} steps, lr {c['lr']}): the mean loss of "
                              f"steps {start}-{start + w - 1} is {a:.3f}, AdamW's is {b:.3f}; the margin is "
                              f"{c['margin']:.0%}")
    return {"AdamW (fp32 states)": fp32, "AdamW8bit": ours}


# ------------------------------------------------------------------------------------------- axes

_BLOCK_AXES = {"weights": ("gaussian", "heavy-tailed", "zero block", "negative extreme", "exact halves",
                           "near halves", "tied extremes", "tiny values"),
               "rank": (1, 2, 3), "n_vs_block": ("1", "below one block", "whole blocks", "a partial last block"),
               "dtype": tuple(NAMES[d] for d in ALL_DTYPES), "layout": ("contiguous", "non-contiguous"),
               "memory": ("quantize", "dequantize"), "memory_dtype": tuple(NAMES[d] for d in ALL_DTYPES),
               "invalid": ("int tensor", "missing scale", "other format")}

AXES = {
    "q8_0": _BLOCK_AXES,
    "q4_0": _BLOCK_AXES,
    "int8_matmul": {"dtype": PROFILE_DTYPES, "x_rank": (1, 2, 3), "x_layout": ("contiguous", "column slice", "transposed"),
                    "values": ("heavy-tailed", "cancelling partial sums"),
                    "tiles": INT8_VARIANTS, "k_vs_block_k": ("a multiple of BLOCK_K", "ragged"),
                    "invalid": ("K mismatch", "int x", "other format", "K not a multiple of 32")},
    "int8_matmul_memory": {"dtype": PROFILE_DTYPES, "tiles": INT8_VARIANTS, "kept": ("after the call",)},
    "blockwise": {"code": ("signed (m)", "unsigned (v)"), "values": ("gaussian", "heavy-tailed", "zero block"),
                  "n_vs_block": ("1", "below one block", "whole blocks", "a partial last block"), "rank": (1, 2, 3),
                  "block": ("default", "other"), "dtype": PROFILE_DTYPES},
    "adamw8bit_step": {"path": ("8-bit", "fp32"), "chunks": ("one (the default)", "several, a partial last"),
                       "steps": (1, 8), "param_rank": (1, 2), "gradients": ("heavy-tailed", "tiny (|g| near eps)"),
                       "grad_zero_block": (True,), "grads_unchanged": (True,),
                       "hyperparameters": ("passed", "the def line's defaults"),
                       "memory": ("chunk=4096",), "kept": ("after the step",), "invalid": ("chunk",)},
    "adamw8bit_convergence": {"optimizer": ("AdamW8bit against torch.optim.AdamW",)},
}


@dataclass(frozen=True)
class _Fixed:
    """A case every run of the check makes, visible and hidden alike (the convergence run; chunk validation)."""
    values: tuple
    hidden: bool
    gpu_only: bool = False

    def axes(self) -> dict:
        return dict(self.values)


_RECORDS = {
    "q8_0": (BLOCK_CASES, BLOCK_MEMORY_CASES, BLOCK_INVALID_CASES),
    "q4_0": (BLOCK_CASES, BLOCK_MEMORY_CASES, BLOCK_INVALID_CASES),
    "int8_matmul": (MATMUL_CASES, MATMUL_INVALID_CASES),
    "int8_matmul_memory": (MATMUL_MEMORY_CASES,),
    "blockwise": (BLOCKWISE_CASES,),
    "adamw8bit_step": (ADAM_CASES, ADAM_MEMORY_CASES,
                       [_Fixed((("invalid", "chunk"),), False), _Fixed((("invalid", "chunk"),), True)]),
    "adamw8bit_convergence": ([_Fixed((("optimizer", "AdamW8bit against torch.optim.AdamW"),), h) for h in (False, True)],),
}


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases` ("visible" or "hidden"), each as {axis: value}: read from the same
    records the check iterates over."""
    return [record.axes() for records in _RECORDS[check] for record in _plan(records, cases)]


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
    for variant in INT8_VARIANTS for dtype in ("fp16", "fp32")
] + [
    # the given fused optimizer step (FusedAdamW8bit): bf16 weights with fp32 gradients, as mixed precision has them
    KernelSpec("adamw8bit_kernel", "adamw8bit",
               {"table_ptr": "*i64", "starts_ptr": "*i32", "n_tensors": "i32", "m_code_ptr": "*fp32",
                "v_code_ptr": "*fp32", "m_mids_ptr": "*fp32", "v_mids_ptr": "*fp32",
                **{name: "fp32" for name in ("lr", "beta1", "beta2", "one_minus_beta1", "one_minus_beta2", "eps",
                                             "decay", "correction1", "correction2")}},
               dtypes=("fp32",), constexprs=dict(P_DTYPE=tl.bfloat16, G_DTYPE=tl.float32, BLOCK=256, M_MIDS=254,
                                                  V_MIDS=254, STEPS=6))
]
