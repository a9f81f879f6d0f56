"""Checks of lesson 04 (solutions/04_kernel_fusion.ipynb): a fused a**4, RMSNorm forward and backward, SwiGLU
forward and backward, drop-in modules that train the course GPT as eager PyTorch does, and the activation
bytes fusion saves.

Each check iterates over case records (the *_CASES lists below, each record visible or hidden); AXES lists what
the exercises' text lets vary, and case_axes reads the same records, so tests/test_check_axes.py proves every
value has a visible and a hidden case. With the hidden cases, the numerics of pow4, RMSNorm and SwiGLU also grade
cases drawn from their exercise's whole domain (pow4_domain() and the like; autograder/checks/domain.py).

Numerics follow the course's rule (autograder/checks/numerics.py): the learner's error against float64 may be
at most 2x the error of PyTorch computing the same thing, plus a floor. "The same thing" is what the exercise
asks for: in fp32 it is eager PyTorch in fp32; in fp16/bf16, where the text says "fp32 inside", it is PyTorch in
fp32 rounded once to the working dtype (eager PyTorch in fp16 is further off: a tolerance from it would pass a
kernel that computes in fp16). pow4 in fp16/bf16 is compared element by element. Gradients are compared with
autograd through the eager formula in float64. Every numerics case runs under guard regions (writes out of
bounds), checks that inputs are unchanged and results alias none of them. Memory budgets come from the outputs'
shapes, on every call path the text offers (out= given or not, each graded dtype), and nothing may stay
allocated after a call.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

import memfit
import memfit.from_lessons.kernel_fusion as reference  # noqa: F401  (imported before the grading guards go up)
from autograder.checks import Check, CheckFailed, KernelSpec, NotImplementedYet, call_learner, check_cases, select
from autograder.checks.domain import Choice, Impossible, Sizes, grade_drawn
from autograder.checks.model_states import drawn_gpt, gpt_domain
from autograder.checks.launches import differs_in_another_order, launched_warps
from autograder.checks.numerics import (allocated_bytes, assert_close_by_rule, call_pure, check_guards, expect_like,
                                        expect_no_torch_arithmetic, guarded_allocations, guarded_empty,
                                        seeded_generator, drawn, summation_bound)
from autograder.checks.numerics import dtype_name as _name, seeded_randn as _randn
from memfit.gpt import rms_norm, swiglu
from memfit.meter import CUDA_ALLOCATOR, LIVE_TENSORS, format_bytes, measure_peak

DTYPES = tuple(memfit.profile().dtypes)  # the dtypes graded on this machine: fp32, fp16 (bf16 where the GPU has it)
DTYPE_NAMES = tuple(_name(d) for d in DTYPES)
BY_NAME = dict(zip(DTYPE_NAMES, DTYPES))  # a drawn case names its dtype


_plan = select  # (autograder/checks/__init__.py: one planner for every check module)


def _same(compute, dtype: torch.dtype, *inputs: torch.Tensor):
    """PyTorch computing what the exercise asks: in fp32 eagerly; in a 16-bit dtype in fp32, rounded once."""
    if dtype == torch.float32:
        return compute(*inputs)
    result = compute(*(t.float() for t in inputs))
    return tuple(r.to(dtype) for r in result) if isinstance(result, tuple) else result.to(dtype)


def _make(shape, dtype, seed: int, scale: float, layout: str = "contiguous") -> torch.Tensor:
    """A seeded tensor of `shape` in one of LAYOUTS: contiguous; a column slice of a wider tensor (rows further
    apart than their length); every other row of a taller one; or (pow4's drawn cases) transposed."""
    shape = tuple(shape)
    if layout == "contiguous":
        return _randn(shape, dtype, seed, scale=scale)
    if layout == "column slice":
        return _randn(shape[:-1] + (shape[-1] + 3,), dtype, seed, scale=scale)[..., :shape[-1]]
    if layout == "every other row":
        return _randn((2 * shape[0],) + shape[1:], dtype, seed, scale=scale)[::2]
    if layout == "every other row, column slice":  # at rank 3 no (rows, h) view exists: reshape must copy
        return _randn((2 * shape[0],) + shape[1:-1] + (shape[-1] + 3,), dtype, seed, scale=scale)[::2, ..., :shape[-1]]
    if layout == "transposed":  # the last two dims swapped: no gaps, but not row-major
        return _randn(shape[:-2] + shape[-2:][::-1], dtype, seed, scale=scale).transpose(-1, -2)
    raise ValueError(layout)


def _layout_name(t: torch.Tensor) -> str:
    return "contiguous" if t.is_contiguous() else f"strided (strides {tuple(t.stride())})"


def _check_memory(fn, what: str, budget: int, budget_text: str, hint: str, results: int = 1,
                  arithmetic_hint: str = "the math belongs in your kernel"):
    """Peak extra bytes within `budget`, nothing kept allocated after the call, no PyTorch arithmetic.
    Returns the call's result."""
    result, report = measure_peak(fn, device=memfit.DEVICE)
    if report.peak_bytes > budget:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds {budget_text} "
                          f"({format_bytes(budget)} with 5%): {hint}")
    slack = 512 * results if report.meter == CUDA_ALLOCATOR else 0  # the allocator rounds each block to 512 B
    if report.kept_bytes > slack:
        raise CheckFailed(f"{what}: {format_bytes(report.kept_bytes)} stayed allocated after the call returned, "
                          "besides its result: keep no scratch tensor alive between calls (in a global, a cache, "
                          "an attribute)")
    ops = report.ops
    if report.meter != LIVE_TENSORS:
        _, live = measure_peak(fn, device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
        ops = live.ops
    expect_no_torch_arithmetic(ops, what, arithmetic_hint)
    return result


# --------------------------------------------------------------------------------------------- pow4

POW4_BLOCK = memfit.config("pow4")["BLOCK"]
LAYOUTS = ("contiguous", "column slice", "every other row", "every other row, column slice")


def _n_vs_block(n: int, block: int) -> str:
    if n < block:
        return "less than one block"
    return "whole blocks" if n % block == 0 else "a partial last block"


@dataclass(frozen=True)
class Pow4Case:
    shape: tuple
    hidden: bool
    layout: str = "contiguous"
    values: str = "normal"  # or "edge": 0, -0, +-1, tiny and large values at the start

    def axes(self) -> dict:
        n = math.prod(self.shape)
        return {"rank": len(self.shape), "n_vs_block": _n_vs_block(n, POW4_BLOCK), "dtype": DTYPE_NAMES,
                "out": ("None", "given") if self.layout == "contiguous" else "None", "layout": self.layout,
                "values": self.values}


B = POW4_BLOCK
POW4_CASES = [
    Pow4Case((17,), False), Pow4Case((B + 1,), False, values="edge"), Pow4Case((2, B // 2), False),
    Pow4Case((3, 5, 7), False, values="edge"), Pow4Case((6, 10), False, layout="every other row"),
    Pow4Case((1,), True), Pow4Case((4 * B,), True, values="edge"), Pow4Case((4097,), True),
    Pow4Case((37, 29), True, values="edge"), Pow4Case((2, 3, 1001), True), Pow4Case((3, 2 * B + 1), True),
    Pow4Case((33, 40), True, layout="every other row", values="edge"),
]


def _pow4_input(case: Pow4Case, dtype, seed: int) -> torch.Tensor:
    layout = "contiguous" if case.layout == "contiguous" else case.layout
    a = _make(case.shape, dtype, seed, 1.5, layout)
    if case.values == "edge":
        top = torch.finfo(dtype).max ** 0.25 * 0.99  # a**4 just below the dtype's largest value
        edge = torch.tensor([0.0, -0.0, 1.0, -1.0, top, -top, 1e-3, -2.5], dtype=dtype, device=a.device)
        flat = a.view(-1) if a.is_contiguous() else a[(0,) * (a.dim() - 1)]  # else the first row, a view
        k = min(edge.numel(), flat.numel())
        flat[:k] = edge[:k]
    return a


def _assert_elementwise(got: torch.Tensor, exact: torch.Tensor, same: torch.Tensor, what: str) -> None:
    """Element by element: |got - exact| <= 2 |same - exact| + 8 fp32 roundings, where `same` is the exact value
    rounded once to the dtype (what fp32 inside a kernel gives, within an fp32 rounding or two). Computing in a
    16-bit dtype rounds at every product and misses this."""
    expect_like(got, same, what)
    g, e, s = (t.detach().to(torch.float64).flatten() for t in (got, exact, same))
    unwritten = torch.isnan(g) & ~torch.isnan(e)
    if unwritten.any():
        first = int(unwritten.nonzero()[0])
        raise CheckFailed(f"{what}: {int(unwritten.sum())} of {g.numel()} output elements are NaN, first at index "
                          f"{first}: they were never written (check your mask and grid)")
    finite = torch.isfinite(s)
    mismatch = (g != s) & ~finite
    if mismatch.any():
        i = int(mismatch.nonzero()[0])
        raise CheckFailed(f"{what}: at index {i} expected {s[i].item():.6g}, got {g[i].item():.6g}")
    tol = 2 * (s - e).abs() + 8 * torch.finfo(torch.float32).eps * e.abs() + torch.finfo(got.dtype).tiny
    err = torch.where(finite, (g - e).abs(), torch.zeros_like(e))
    bad = err > tol
    if bad.any():
        i = int((err - tol).argmax())
        raise CheckFailed(f"{what}: at index {i} (a = {e[i].item() ** 0.25:.6g} in magnitude) expected "
                          f"{e[i].item():.6g}, got {g[i].item():.6g}: error {err[i].item():.3g} exceeds the "
                          f"tolerance {tol[i].item():.3g} = 2 x the error of one rounding of the exact value to "
                          f"{_name(got.dtype)}: compute in fp32 inside the kernel and round once, when storing")


def _compare_pow4(got, a, what: str) -> None:
    """Element by element in every dtype: the course's rule scales its floor with the largest value, and the
    edge values reach the dtype's largest a**4."""
    exact = a.double() ** 4
    _assert_elementwise(got, exact, exact.to(a.dtype), what)


def _check_pow4(pow4, case: Pow4Case, dtype, seed: int, outs=("given", "None")) -> None:
    """One case in one dtype, on each call path of `outs` (a contiguous `a`: out= given, out=None)."""
    a = _pow4_input(case, dtype, seed)
    what = f"pow4(a) with a of shape {tuple(a.shape)} ({_layout_name(a)}), {_name(dtype)}"
    if case.layout != "contiguous":
        try:
            with guarded_allocations():
                got = call_pure(pow4, a, what=what)
        except CheckFailed as exc:  # a ValueError for a strided `a` is what the text allows
            if "raised ValueError" in str(exc):
                return
            raise
        _compare_pow4(got, a, what + " (raise ValueError for an `a` you cannot read as a flat array)")
        return
    if "given" in outs:
        out = guarded_empty(a.shape, dtype, a.device)
        with guarded_allocations():
            got = call_pure(pow4, a, out=out, what=what + " and out=", writable=("out",))
        check_guards(out, what + " and out=")
        if got is not out:
            raise CheckFailed(f"{what}: with out= given, pow4 must write into it and return it")
        _compare_pow4(out, a, what + " (into out=)")
    if "None" in outs:
        with guarded_allocations():
            got = call_pure(pow4, a, what=what)
        _compare_pow4(got, a, what)


def pow4_domain() -> dict:
    """Every call the text allows: any shape (0-d too), lengths around the block, each dtype, out= or not, views
    that are not contiguous (with gaps, or transposed), edge values (autograder/checks/domain.py draws hidden cases
    from it)."""
    b = POW4_BLOCK
    return {"n": Sizes(1, 3 * b + 7, edges=(1, 2, b - 1, b, b + 1, 2 * b - 1, 2 * b, 2 * b + 1)),
            "rank": Choice(1, 2, 3, 0), "lead": Sizes(1, 4), "dtype": Choice(*DTYPE_NAMES),
            "out": Choice("None", "given"), "layout": Choice(*LAYOUTS, "transposed"),
            "values": Choice("normal", "edge")}


def _shape(rank: int, lead: int, n: int) -> tuple:
    """A drawn case's shape: n the last dimension, `lead` the first of rank 2 and 3."""
    return {0: (), 1: (n,), 2: (lead, n), 3: (lead, 2, n)}[rank]


def _strided_rows(rank: int, layout: str) -> None:
    """Views that are not contiguous: a column slice or a transpose needs rows (a 1-D one would be contiguous); a
    0-d tensor has no view."""
    if layout != "contiguous" and (rank == 0 or (rank == 1 and layout in ("column slice", "transposed"))):
        raise Impossible()


DRAWN_POW4_CASES = 16


def check_pow4_numerics(pow4, cases: str = "visible") -> None:
    for seed, case in enumerate(_plan(POW4_CASES, cases)):
        for dtype in DTYPES:
            _check_pow4(pow4, case, dtype, seed)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            _strided_rows(drawn["rank"], drawn["layout"])
            case = Pow4Case(_shape(drawn["rank"], drawn["lead"], drawn["n"]), True, drawn["layout"], drawn["values"])
            _check_pow4(pow4, case, BY_NAME[drawn["dtype"]], drawn["seed"], outs=(drawn["out"],))
        grade_drawn(pow4_domain(), "pow4_numerics", DRAWN_POW4_CASES, check_one)


@dataclass(frozen=True)
class Pow4MemoryCase:
    n: int
    hidden: bool

    def axes(self) -> dict:
        return {"dtype": DTYPE_NAMES, "out": ("None", "given")}


# sizes no numerics case uses, so a scratch cached by size cannot hide
POW4_MEMORY_CASES = [Pow4MemoryCase(3 * B + 5, False), Pow4MemoryCase(1 << 16 | 7, True)]


def check_pow4_memory(pow4, cases: str = "visible") -> None:
    for case in _plan(POW4_MEMORY_CASES, cases):
        for dtype in DTYPES:
            _pow4_memory_case(pow4, case.n, dtype, 7)
    if check_cases(cases)[1]:
        grade_drawn({"n": Sizes(1, 1 << 20, edges=(1, POW4_BLOCK - 1, POW4_BLOCK + 1)), "dtype": Choice(*DTYPE_NAMES)},
                    "pow4_memory", DRAWN_POW4_MEMORY_CASES,
                    lambda d: _pow4_memory_case(pow4, d["n"], BY_NAME[d["dtype"]], d["seed"]))


DRAWN_POW4_MEMORY_CASES = 3  # sizes of a contiguous a: below a block, a partial last block, up to a million


def _pow4_memory_case(pow4, n: int, dtype, seed: int) -> None:
    a = _randn(n, dtype, seed)
    what = f"pow4 at n={n:,}, {_name(dtype)}"
    nbytes = n * a.element_size()
    out = _check_memory(lambda: call_learner(pow4, a, what=what), what,
                        math.ceil(1.05 * allocated_bytes(nbytes)),
                        "the output's", "a fused kernel allocates no temporaries")
    expect_like(out, a, what)
    out = torch.empty_like(a)
    _check_memory(lambda: call_learner(pow4, a, out=out, what=what + " and out="), what + " and out= given",
                  math.ceil(0.05 * nbytes), "nothing (5% of the output)",
                  "with out= given, write into it directly: no temporary, no copy", results=0)


# ------------------------------------------------------------------------------------------ RMSNorm

EPS = 1e-5
RMS_BLOCK = memfit.config("rmsnorm")["BLOCK"]
MAGNITUDES = {"small": 0.03, "normal": 2.0, "large": 400.0}  # large: fp16 squares overflow, sums need fp32


def _rmsnorm_eager(x, w, eps=EPS):
    return rms_norm(x, w, eps)


def _h_kind(h: int) -> str:
    return "1" if h == 1 else "a power of two" if h & (h - 1) == 0 else "not a power of two"


@dataclass(frozen=True)
class RmsCase:
    shape: tuple
    hidden: bool
    layout: str = "contiguous"
    magnitude: str = "normal"
    eps: float = EPS

    def axes(self) -> dict:
        return {"path": "numerics", "rank": len(self.shape), "h": _h_kind(self.shape[-1]), "layout": self.layout, "dtype": DTYPE_NAMES,
                "magnitude": self.magnitude, "eps": self.eps}


RMS_CASES = [
    RmsCase((4, 128), False), RmsCase((3, 5, 100), False, "column slice", "large"),
    RmsCase((1,), False, magnitude="small", eps=1e-2), RmsCase((6, 33), False, "every other row", "small", 1e-2),
    RmsCase((100,), False), RmsCase((2, 3, 1), False),
    RmsCase((1, 4096), True, magnitude="large"), RmsCase((37, 1000), True, "column slice"),
    RmsCase((64, 257), True, magnitude="small", eps=1e-2), RmsCase((5, 3000), True, "every other row", "large"),
    RmsCase((2, 7, 64), True, "every other row", "small", 1e-2), RmsCase((1, 1), True), RmsCase((515,), True),
    RmsCase((3, 4, 128), False, "every other row, column slice"), RmsCase((2, 5, 77), True, "every other row, column slice"),
]


@dataclass(frozen=True)
class MemoryCase:
    """A memory measurement: rows x h (x or gate), contiguous (halves of one tensor for SwiGLU), every dtype."""
    rows: int
    h: int
    hidden: bool

    def axes(self) -> dict:
        return {"path": "memory", "dtype": DTYPE_NAMES}


RMS_MEMORY_CASES = [MemoryCase(16, 300, False), MemoryCase(64, 1000, True)]
# rows here are per program (rows * P + 3 in all: more rows than the text's P programs on every machine, so a
# partial buffer of one row per row of x, or per program of another count, shows); sizes numerics do not use
RMS_BACKWARD_MEMORY_CASES = [MemoryCase(4, 300, False), MemoryCase(16, 1000, True)]
SWIGLU_MEMORY_CASES = [MemoryCase(16, 300, False), MemoryCase(64, 1000, True)]


def _rms_inputs(case: RmsCase, dtype, seed: int):
    x = _make(case.shape, dtype, seed, MAGNITUDES[case.magnitude], case.layout)
    w = _randn(case.shape[-1], dtype, seed + 100) + 1  # not all ones: a weight left out of a formula shows
    return x, w


def _check_rms_forward(rmsnorm_forward, case: RmsCase, dtype, seed: int) -> None:
    x, w = _rms_inputs(case, dtype, seed)
    what = (f"rmsnorm_forward(x of shape {case.shape} ({_layout_name(x)}, |x| ~ {MAGNITUDES[case.magnitude]}"
            f"), eps={case.eps:g}, {_name(dtype)})")
    with guarded_allocations(), launched_warps() as launches:
        got = call_pure(rmsnorm_forward, x, w, case.eps, what=what)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return (y, rstd), got {type(got).__name__}")
    for kernel, used, block in launches:  # (a kernel that walks the row in smaller blocks: warps for its block)
        block = block or 1 << max(0, (x.shape[-1] - 1).bit_length())
        if used != _text_warps(block):
            raise CheckFailed(f"{what} launched {kernel} with num_warps={used}; the text asks for "
                              f"{_text_warps(block)} for a block of {block} columns (4 up to 2048, 8 up to 8192, 16 "
                              "beyond): too many warps for a short row leave threads idle, too few for a long one run "
                              "out of registers")
    y, rstd = got
    rows = x.numel() // x.shape[-1]
    eager = lambda x_, w_: _rmsnorm_eager(x_, w_, case.eps)  # noqa: E731
    assert_close_by_rule(y, eager(x.double(), w.double()), _same(eager, dtype, x, w), what + ", y")
    if not isinstance(rstd, torch.Tensor) or rstd.dtype != torch.float32 or tuple(rstd.shape) != (rows,):
        raise CheckFailed(f"{what}: rstd should be fp32 of shape (rows,) = ({rows},), one value per row of "
                          f"x flattened to (rows, h), got {getattr(rstd, 'dtype', type(rstd).__name__)} of "
                          f"shape {tuple(getattr(rstd, 'shape', ()))}")
    exact_rstd = torch.rsqrt(x.double().pow(2).mean(-1) + case.eps).reshape(-1)
    torch_rstd = torch.rsqrt(x.float().pow(2).mean(-1) + case.eps).reshape(-1)
    assert_close_by_rule(rstd, exact_rstd, torch_rstd, what + ", rstd")


def _row_sizes() -> Sizes:
    """h up to the longest row the text allows, with edges where the row's power-of-two block changes."""
    hb = RMS_BLOCK
    return Sizes(1, hb, edges=(1, 2, 255, 256, 257, 1023, 1024, 1025, hb - 1, hb))


def rmsnorm_domain() -> dict:
    """Every call the text allows: any leading dims (none too), any h up to the block, rows strided or not, each
    dtype, magnitude and an eps of the caller's (autograder/checks/domain.py draws hidden cases from it)."""
    return {"h": _row_sizes(), "rank": Choice(1, 2, 3), "lead": Sizes(1, 24, edges=(1, 2)),
            "layout": Choice(*LAYOUTS), "dtype": Choice(*DTYPE_NAMES), "magnitude": Choice("normal", "small", "large"),
            "eps": Choice(EPS, 1e-2, 1e-6, 0.1)}


def _strided_rows_only(rank: int, layout: str) -> None:
    """The text's views have rows apart, each row contiguous: a 1-D x is one row (a strided one is not allowed)."""
    if rank == 1 and layout != "contiguous":
        raise Impossible()


DRAWN_RMSNORM_CASES = 12


def check_rmsnorm_forward(rmsnorm_forward, cases: str = "visible") -> None:
    for seed, case in enumerate(_plan(RMS_CASES, cases)):
        for dtype in DTYPES:
            _check_rms_forward(rmsnorm_forward, case, dtype, seed)
    for case, dtype in ((c, d) for c in _plan(RMS_MEMORY_CASES, cases) for d in DTYPES):
        x = _randn((case.rows, case.h), dtype, 1)
        w = _randn(case.h, dtype, 2)
        what = f"rmsnorm_forward on {case.rows} rows of {case.h} ({_name(dtype)})"
        _check_memory(lambda: call_learner(rmsnorm_forward, x, w, EPS, what=what), what,
                      math.ceil(1.05 * allocated_bytes(x.numel() * x.element_size(), case.rows * 4)), "y + rstd",
                      "keep the row in registers, allocate nothing else", results=2)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            _strided_rows_only(drawn["rank"], drawn["layout"])
            case = RmsCase(_shape(drawn["rank"], drawn["lead"], drawn["h"]), True, drawn["layout"],
                           drawn["magnitude"], drawn["eps"])
            _check_rms_forward(rmsnorm_forward, case, BY_NAME[drawn["dtype"]], drawn["seed"])
        grade_drawn(rmsnorm_domain(), "rmsnorm_forward", DRAWN_RMSNORM_CASES, check_one)


def _text_programs(h: int) -> int:
    """The programs Exercise 3's text asks for: 16 / num_warps per SM (at least one), 4 on a CPU."""
    if torch.device(memfit.DEVICE).type != "cuda":
        return 4
    return torch.cuda.get_device_properties(memfit.DEVICE).multi_processor_count * max(1, 16 // _text_warps(h))


def _text_warps(h: int) -> int:
    """The num_warps Exercise 2's text asks for a row of h: 4 up to a 2048-column block, 8 up to 8192, 16 beyond."""
    block = 1 << max(0, (h - 1).bit_length())
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


@dataclass(frozen=True)
class RmsBackwardCase:
    lead: tuple  # leading dims, with "P" for the text's number of programs (4 on a CPU), e.g. ("2*P+1",)
    h: int
    hidden: bool
    layout: str = "contiguous"
    magnitude: str = "normal"
    dy_layout: str | None = None  # dy's own layout (the text lets dy and x be strided apart); None: x's
    eps: float = EPS  # the eps the forward's rstd was computed with: the backward must use rstd, not recompute it
    weight: str = "x's dtype"  # or "fp32": a mixed-precision model's fp32 weight beside 16-bit activations
    signs: str = "mixed"  # "cancelling": x near 1 and dy near +-1 by row, so dw is a sum of near-opposite terms:
    # a small sum of large terms, where a 16-bit partial sum (or a product rounded to 16 bits) is off by its roundoff

    def shape(self) -> tuple:
        p = _text_programs(self.h)
        return tuple(eval(d, {"P": p}) if isinstance(d, str) else d for d in self.lead) + (self.h,)  # noqa: S307

    def axes(self) -> dict:
        shape = self.shape()
        rows, p = math.prod(shape[:-1]), _text_programs(self.h)
        kind = "fewer rows than programs" if rows < p else "a multiple of the programs" if rows % p == 0 else \
            "not a multiple of the programs"
        return {"path": "numerics", "rank": len(shape), "h": _h_kind(self.h), "layout": self.layout, "dtype": DTYPE_NAMES,
                "magnitude": self.magnitude, "rows_vs_programs": kind,
                "dy_layout": "x's" if self.dy_layout in (None, self.layout) else "another", "eps": self.eps,
                "signs": self.signs, "weight": self.weight}


RMS_BACKWARD_CASES = [
    RmsBackwardCase((3,), 128, False), RmsBackwardCase(("2*P+1",), 100, False, "column slice", "large"),
    RmsBackwardCase((2, "P"), 64, False, "every other row", dy_layout="column slice"),
    RmsBackwardCase((), 1, False),
    RmsBackwardCase((1, 1), 33, False, magnitude="large"),
    RmsBackwardCase(("P+1",), 40, False, magnitude="small", dy_layout="every other row", eps=1e-2),
    RmsBackwardCase(("3*P+2",), 64, False, eps=0.1, signs="cancelling"),
    RmsBackwardCase(("P-1",), 1000, True, "every other row", "large"), RmsBackwardCase(("3*P+2",), 257, True, magnitude="small", eps=1e-2),
    RmsBackwardCase((3, "P"), 64, True, "column slice", dy_layout="contiguous"),
    RmsBackwardCase((2, 5, 1), 3000, True),
    RmsBackwardCase((5,), 1, True), RmsBackwardCase((), 4096, True, magnitude="large"),
    RmsBackwardCase((2, "P"), 300, True, "column slice", "small", dy_layout="every other row", eps=0.1),
    RmsBackwardCase(("2*P+3",), 200, True, "every other row", dy_layout="column slice", signs="cancelling"),
    RmsBackwardCase((3, "P"), 96, False, "every other row, column slice", weight="fp32"),
    RmsBackwardCase(("P", 2), 130, True, "every other row, column slice", dy_layout="contiguous", weight="fp32"),
]


def _check_rms_backward(rmsnorm_backward, case: RmsBackwardCase, dtype, seed: int) -> None:
    shape = case.shape()
    x = _make(shape, dtype, seed, MAGNITUDES[case.magnitude], case.layout)
    w = _randn(shape[-1], torch.float32 if case.weight == "fp32" else dtype, seed + 100) + 1
    dy = _make(shape, dtype, seed + 200, 1.0, case.dy_layout or case.layout)
    if case.signs == "cancelling":  # (rank 2 cases): rows of x near 1, of dy near +1 and -1 in turn
        x.mul_(0.005).add_(1), dy.mul_(0.01).add_(1), dy[1::2].neg_()
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + case.eps).reshape(-1)
    values = ("x near 1, dy rows near +1 and -1 in turn, so dweight is a small sum of large terms"
              if case.signs == "cancelling" else f"|x| ~ {MAGNITUDES[case.magnitude]}")
    what = (f"rmsnorm_backward(dy ({_layout_name(dy)}), x of shape {shape} ({_layout_name(x)}, {values}), "
            f"rstd from eps={case.eps:g}, {_name(dtype)}{', weight fp32' if w.dtype != dtype else ''})")
    with guarded_allocations():
        got = call_pure(rmsnorm_backward, dy, x, w, rstd, what=what)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return (dx, dweight), got {type(got).__name__}")
    dx, dw = got
    exact, same = [], []
    for target, precision in ((exact, torch.float64), (same, torch.float32)):
        xi = x.detach().to(precision).requires_grad_(True)
        wi = w.detach().to(precision).requires_grad_(True)
        _rmsnorm_eager(xi, wi, case.eps).backward(dy.to(precision))
        target.extend([xi.grad, wi.grad] if precision == torch.float64 else
                      [xi.grad.to(dtype), wi.grad.to(w.dtype)])
    # dx = rstd * (dy*w - x_hat * mean(dy*w*x_hat)): at h = 1 the two terms cancel almost exactly, so the
    # floor is relative to the first term's size, not to the tiny difference.
    terms = (dy.double() * w.double()).reshape(-1, shape[-1]) * rstd.double()[:, None]
    assert_close_by_rule(dx, exact[0], same[0], what + ", dx", scale=terms.abs().max().item())
    # dweight sums one product per row: any fixed order of that sum keeps its points (the same bits on every run)
    rows = terms.shape[0]
    products = (dy.double() * x.double()).reshape(-1, shape[-1]) * rstd.double()[:, None]
    bound = summation_bound(products.abs().sum(0), rows + 2, torch.float32)
    assert_close_by_rule(dw, exact[1], same[1], what + ", dweight (summed over all rows in fp32)", bound=bound)
    changed = differs_in_another_order(lambda *a: call_pure(rmsnorm_backward, *a, what=what), (dy, x, w, rstd),
                                       (dx, dw), ("dx", "dweight"))
    if changed:
        raise CheckFailed(f"{what}: called again with the same inputs, its programs run in another order (a GPU runs "
                          f"them in any order), it returned other bits for {changed}. The text asks for the same "
                          "result on every run: each program sums its own rows into its own row of the (programs, h) "
                          "buffer, and one .sum(0) adds those rows (atomic adds into one shared row land in a "
                          "different order each run)")


def rmsnorm_backward_domain() -> dict:
    """Every call the text allows: rows around the text's number of programs P (4 on a CPU; P of the shortest rows'
    warps on a GPU), any h up to the block, dy and x strided or not, each dtype and magnitude."""
    p = _text_programs(1)
    rows = Sizes(1, 3 * p + 2, edges=tuple(sorted({1, 2, max(1, p - 1), p, p + 1, 2 * p + 1, 3 * p + 2})))
    return {"h": _row_sizes(), "rank": Choice(1, 2, 3), "rows": rows, "layout": Choice(*LAYOUTS),
            "dy_layout": Choice(*LAYOUTS), "dtype": Choice(*DTYPE_NAMES), "weight": Choice("x's dtype", "fp32"),
            "magnitude": Choice("normal", "large", "small"), "eps": Choice(EPS, 1e-2, 1e-6, 0.1)}


DRAWN_RMSNORM_BACKWARD_CASES = 12


def check_rmsnorm_backward(rmsnorm_forward, rmsnorm_backward, cases: str = "visible") -> None:
    """Graded on its own: rstd comes from PyTorch (fp32), not from the learner's rmsnorm_forward, so a bug in the
    forward costs rmsnorm_forward's points only (`rmsnorm_forward` is accepted for the notebook's call)."""
    for seed, case in enumerate(_plan(RMS_BACKWARD_CASES, cases)):
        for dtype in DTYPES:
            _check_rms_backward(rmsnorm_backward, case, dtype, seed)
    for case, dtype in ((c, d) for c in _plan(RMS_BACKWARD_MEMORY_CASES, cases) for d in DTYPES):
        rows, h = case.rows * _text_programs(case.h) + 3, case.h
        x, dy = _randn((rows, h), dtype, 3, scale=2.0), _randn((rows, h), dtype, 4)
        w = _randn(h, dtype, 5) + 1
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
        what = f"rmsnorm_backward on {rows} rows of {h} ({_name(dtype)})"
        partial_rows = _text_programs(h)  # the text's (programs, h) buffer
        budget = allocated_bytes(x.numel() * x.element_size(), partial_rows * h * 4, h * 4, h * x.element_size())
        _check_memory(lambda: call_learner(rmsnorm_backward, dy, x, w, rstd, what=what), what,
                      math.ceil(1.05 * budget), f"dx + a ({partial_rows}, h) fp32 buffer of partial dw rows + dw",
                      "recompute x_hat in the kernel, store only dx and the partial rows", results=2,
                      arithmetic_hint="the math belongs in your kernel (only the final .sum(0) of the partial rows "
                                      "and the cast to the weight's dtype belong in PyTorch)")
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            _strided_rows_only(drawn["rank"], drawn["layout"])
            _strided_rows_only(drawn["rank"], drawn["dy_layout"])
            lead = _shape(drawn["rank"], drawn["rows"], 0)[:-1]  # rank 2: (rows,); rank 3: (rows, 2)
            case = RmsBackwardCase(lead, drawn["h"], True, drawn["layout"], drawn["magnitude"], drawn["dy_layout"],
                                   drawn["eps"], drawn["weight"])
            _check_rms_backward(rmsnorm_backward, case, BY_NAME[drawn["dtype"]], drawn["seed"])
        grade_drawn(rmsnorm_backward_domain(), "rmsnorm_backward", DRAWN_RMSNORM_BACKWARD_CASES, check_one)


# ------------------------------------------------------------------------------------------- SwiGLU

SWIGLU_BLOCK = memfit.config("swiglu")["BLOCK"]
OPERANDS = ("halves of one tensor", "separate, contiguous", "separate, other row strides")


@dataclass(frozen=True)
class SwigluCase:
    shape: tuple
    hidden: bool
    operands: str = "halves of one tensor"
    magnitude: str = "normal"  # or "large": |gate| up to ~150, sigmoid saturates and exp(+-g) overflows fp32

    def axes(self) -> dict:
        return {"path": "numerics", "rank": len(self.shape), "f_vs_block": _n_vs_block(self.shape[-1], SWIGLU_BLOCK),
                "operands": self.operands, "dtype": DTYPE_NAMES, "magnitude": self.magnitude}


S = SWIGLU_BLOCK
SWIGLU_CASES = [
    SwigluCase((4, 64), False), SwigluCase((3, 5, 100), False, "separate, other row strides", "large"),
    SwigluCase((2, S + 5), False, "separate, contiguous"), SwigluCase((2, S), False, magnitude="large"),
    SwigluCase((7,), False),
    SwigluCase((1, 1), True), SwigluCase((37, 1000), True, "separate, other row strides"),
    SwigluCase((2, 3, 2 * S + 52), True, magnitude="large"), SwigluCase((3, 2 * S), True, "separate, contiguous"),
    SwigluCase((2, 2, 300), True, "separate, contiguous", "large"), SwigluCase((33,), True,
                                                                             "separate, other row strides"),
]


def _swiglu_inputs(case: SwigluCase, dtype, seed: int):
    scale = 3.0 if case.magnitude == "normal" else 60.0
    lead, f = case.shape[:-1], case.shape[-1]
    if case.operands == "halves of one tensor":
        gate, up = _randn(lead + (2 * f,), dtype, seed, scale=scale).chunk(2, dim=-1)  # as the GPT's w13 output
    elif case.operands == "separate, contiguous":
        gate, up = _randn(case.shape, dtype, seed, scale=scale), _randn(case.shape, dtype, seed + 1, scale=3.0)
    else:
        gate = _make(case.shape, dtype, seed, scale, "column slice")
        up = _make(case.shape, dtype, seed + 1, 3.0, "every other row" if lead else "contiguous")
    if case.magnitude == "large":  # fp32's exp overflows past 88.7: some gates well past it, both signs
        edge = torch.tensor([100.0, -100.0, 150.0, -150.0], dtype=dtype, device=gate.device)
        first = gate[(0,) * (gate.dim() - 1)]  # the first row, a view whatever the layout
        k = min(4, f)
        first[:k] = edge[:k]
    return gate, up


def _check_swiglu(swiglu_forward, swiglu_backward, case: SwigluCase, dtype, seed: int) -> None:
    gate, up = _swiglu_inputs(case, dtype, seed)
    what = (f"on gate and up of shape {case.shape} ({case.operands}: row strides {gate.stride()[:-1] or '-'}"
            f" and {up.stride()[:-1] or '-'}), {'|gate| up to 150, ' if case.magnitude == 'large' else ''}"
            f"{_name(dtype)}")
    with guarded_allocations():
        h = call_pure(swiglu_forward, gate, up, what="swiglu_forward " + what)
    exact = swiglu(gate.double(), up.double())
    assert_close_by_rule(h, exact, _same(swiglu, dtype, gate, up), "swiglu_forward " + what)
    dh = _randn(case.shape, dtype, seed + 50)
    with guarded_allocations():
        got = call_pure(swiglu_backward, dh, gate, up, what="swiglu_backward " + what)
    want_shape = case.shape[:-1] + (2 * case.shape[-1],)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != want_shape:
        raise CheckFailed(f"swiglu_backward {what} should return one tensor of shape {want_shape} "
                          f"([dgate | dup]), got {getattr(got, 'shape', type(got).__name__)}")
    got = got.chunk(2, dim=-1)
    grads = {}
    for key, precision in (("exact", torch.float64), ("same", torch.float32)):
        g = gate.detach().to(precision).requires_grad_(True)
        u = up.detach().to(precision).requires_grad_(True)
        swiglu(g, u).backward(dh.to(precision))
        grads[key] = (g.grad, u.grad) if key == "exact" else (g.grad.to(dtype), u.grad.to(dtype))
    assert_close_by_rule(got[0], grads["exact"][0], grads["same"][0], "swiglu_backward " + what + ", dgate")
    assert_close_by_rule(got[1], grads["exact"][1], grads["same"][1], "swiglu_backward " + what + ", dup")


def swiglu_domain() -> dict:
    """Every call the text allows: any leading dims, f around the column block, each way of passing gate and up,
    each dtype, |gate| moderate or past exp's overflow (autograder/checks/domain.py draws hidden cases from it)."""
    b = SWIGLU_BLOCK
    return {"f": Sizes(1, 3 * b + 7, edges=(1, 2, b - 1, b, b + 1, 2 * b, 2 * b + 1)), "rank": Choice(1, 2, 3),
            "lead": Sizes(1, 4), "operands": Choice(*OPERANDS), "dtype": Choice(*DTYPE_NAMES),
            "magnitude": Choice("normal", "large")}


DRAWN_SWIGLU_CASES = 12


def check_swiglu(swiglu_forward, swiglu_backward, cases: str = "visible") -> None:
    for seed, case in enumerate(_plan(SWIGLU_CASES, cases)):
        for dtype in DTYPES:
            _check_swiglu(swiglu_forward, swiglu_backward, case, dtype, seed)
    for case, dtype in ((c, d) for c in _plan(SWIGLU_MEMORY_CASES, cases) for d in DTYPES):
        rows, f = case.rows, case.h
        gate, up = _randn((rows, 2 * f), dtype, 9).chunk(2, dim=-1)
        dh = _randn((rows, f), dtype, 10)
        nbytes = rows * f * gate.element_size()
        what = f"swiglu_forward on gate and up, halves of one {rows} x {2 * f} tensor ({_name(dtype)})"
        _check_memory(lambda: call_learner(swiglu_forward, gate, up, what=what), what,
                      math.ceil(1.05 * allocated_bytes(nbytes)),
                      "h", "read gate and up where they are (their row strides): no contiguous copies, no "
                      "temporaries")
        what = f"swiglu_backward on {rows} x {f} ({_name(dtype)}; gate and up halves of one tensor)"
        _check_memory(lambda: call_learner(swiglu_backward, dh, gate, up, what=what), what,
                      math.ceil(1.05 * allocated_bytes(2 * nbytes)), "[dgate | dup]",
                      "recompute silu inside the kernel and write both halves into the one output: store nothing "
                      "else")
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            case = SwigluCase(_shape(drawn["rank"], drawn["lead"], drawn["f"]), True, drawn["operands"],
                              drawn["magnitude"])
            _check_swiglu(swiglu_forward, swiglu_backward, case, BY_NAME[drawn["dtype"]], drawn["seed"])
        grade_drawn(swiglu_domain(), "swiglu", DRAWN_SWIGLU_CASES, check_one)


# ------------------------------------------------------------------------------------ the fused GPT

def _train(model, cfg, steps: int, seed_base: int) -> list[float]:
    from memfit.training import random_batch
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        idx, targets = random_batch(cfg, 2, 16, memfit.DEVICE, seed=seed_base + step % 3)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _block0_activation_bytes(model, idx, targets) -> int:
    """Bytes of the activations autograd saves in block 0 (memfit.training.saved_tensors, from lesson 02); a tensor a
    custom Function kept as a ctx attribute fails the check (autograder/checks/contracts.py, contract 5)."""
    from memfit.training import saved_tensors
    saved = saved_tensors(model, idx, targets)
    on_ctx = [s for s in saved if s.kind == "ctx attribute"]
    if on_ctx:
        raise CheckFailed(f"a custom autograd.Function in {on_ctx[0].module} kept a tensor of shape {on_ctx[0].shape} "
                          "as a ctx attribute: keep the tensors backward needs with ctx.save_for_backward(...) and "
                          "read them back from ctx.saved_tensors (only numbers, shapes and flags as ctx attributes)")
    return sum(s.nbytes for s in saved if s.module.startswith("blocks.0") and s.kind == "activation")


@dataclass(frozen=True)
class GptCase:
    config: str
    hidden: bool

    def axes(self) -> dict:
        return {"norm_weights": "not ones", "measured": ("gradients", "loss curve", "activations kept")}


GPT_CASES = [GptCase("tiny", False), GptCase("tiny-mha", True)]


def _swapped(use_fused_kernels, model, name: str):
    """use_fused_kernels(model), as its docstring says: the model it is given, changed in place (the notebook keeps
    using trainer.model), the same parameter objects (an optimizer made before holds them), no eager module left."""
    from memfit.gpt import RMSNorm, SwiGLU
    before = list(model.parameters())
    fused = call_learner(use_fused_kernels, model, what=f"use_fused_kernels({name} model)")
    if fused is not model:
        raise CheckFailed(f"use_fused_kernels({name} model) should swap the modules of the model it is given, in place, "
                          f"and return that model; it returned {'another' if isinstance(fused, torch.nn.Module) else 'a'} "
                          f"{type(fused).__name__}")
    after = list(model.parameters())
    if len(after) != len(before) or any(a is not b for a, b in zip(before, after)):
        raise CheckFailed(f"use_fused_kernels({name} model): the model's parameters are not the objects they were "
                          "before: swap each module's class and keep its weights, so an optimizer made before still "
                          "updates them")
    kinds = [type(m) for m in model.modules()]
    if RMSNorm in kinds or SwiGLU in kinds:
        raise CheckFailed(f"{name}: after use_fused_kernels the model still has eager "
                          f"{'RMSNorm' if RMSNorm in kinds else 'SwiGLU'} modules")
    return fused


def check_fused_gpt(use_fused_kernels, cases: str = "visible") -> dict:
    """The learner's fused GPT (with the learner's kernels: this check grades them working together in training)
    against eager PyTorch: one step's gradients, parameter by parameter, with norm weights that are not all ones
    (as after training); the activations block 0 keeps for backward, against the reference fused modules; a
    loss curve of 12 AdamW steps. Returns the curves it compared: {"course-tiny": {"eager": [...], "fused": [...]}}."""
    curves = {}
    from memfit.gpt import COURSE_CONFIGS, GPT
    for case in _plan(GPT_CASES, cases):
        name = case.config
        cfg = COURSE_CONFIGS[name]
        eager, fused = _one_step_alike(use_fused_kernels, cfg, f"course-{name}", drawn(0))
        # and a Gemma-2 block, whose post-norms are RMSNorms too (swapped only: no step)
        _swapped(use_fused_kernels, GPT(cfg.scaled(post_norms=True)).to(memfit.DEVICE), f"course-{name} with post_norms")
        # AdamW divides by the gradients' running size, so rounding grows over the steps at a rate that depends on
        # the draw: the curve may part from eager's by 0.1%, or (on a draw where that is too tight) by 3x as much as
        # the reference fused kernels' curve parts from it on the same draw (another right rounding).
        steps = 12
        start = copy.deepcopy(eager)
        a, b = _train(eager, cfg, steps, 0), _train(fused, cfg, steps, 0)
        allowed = [1e-3 * abs(x) for x in a]
        if any(abs(x - y) > tol for x, y, tol in zip(a, b, allowed)):
            r = _train(reference.use_fused_kernels(start), cfg, steps, 0)
            allowed = [max(tol, 3 * abs(x - z)) for x, z, tol in zip(a, r, allowed)]
        worst = max(range(steps), key=lambda i: abs(a[i] - b[i]) / allowed[i])
        if abs(a[worst] - b[worst]) > allowed[worst]:
            raise CheckFailed(f"course-{name}: the loss curves part at step {worst}: eager {a[worst]:.5f}, fused "
                              f"{b[worst]:.5f}, allowed {allowed[worst]:.5f} (0.1%, or 3x as far as the reference "
                              "fused kernels' curve)")
        curves[f"course-{name}"] = {"eager": a, "fused": b}
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            cfg = drawn_gpt(d).scaled(post_norms=d["post_norms"])
            _one_step_alike(use_fused_kernels, cfg, cfg.name + (" with post_norms" if d["post_norms"] else ""),
                            d["seed"])
        grade_drawn({**gpt_domain(), "post_norms": Choice(False, True)}, "fused_gpt", DRAWN_GPT_CASES, check_one)
    return curves


DRAWN_GPT_CASES = 2  # small GPTs (lesson 02's drawn ones), post_norms or not: one step's gradients and kept bytes


def _one_step_alike(use_fused_kernels, cfg, name: str, seed: int):
    """(eager, fused) after one step of each with norm weights that are not all ones: every parameter's gradient the
    same within 1e-4 of its largest entry, and block 0 keeping no more for backward than the reference fused
    modules. Both come back with no gradients."""
    from memfit.gpt import GPT, RMSNorm
    from memfit.training import random_batch
    torch.manual_seed(seed)
    eager = GPT(cfg).to(memfit.DEVICE)
    gen = seeded_generator(1)
    with torch.no_grad():
        for module in eager.modules():
            if isinstance(module, RMSNorm):
                module.weight.copy_(1 + 0.5 * torch.randn(module.weight.shape, generator=gen))
    fused = _swapped(use_fused_kernels, copy.deepcopy(eager), name)
    # Gradients of one step, parameter by parameter.
    idx, targets = random_batch(cfg, 2, 16, memfit.DEVICE, seed=99)
    eager(idx, targets).backward()
    try:
        loss = call_learner(lambda: fused(idx, targets), what=f"the fused {name} forward")
        call_learner(loss.backward, what=f"the fused {name} backward")
    except NotImplementedYet:
        raise NotImplementedYet("the fused modules call your kernels (rmsnorm_forward, rmsnorm_backward, "
                                "swiglu_forward, swiglu_backward), and one is not implemented yet") from None
    for (pname, p), q in zip(eager.named_parameters(), fused.parameters()):
        if q.grad is None:
            raise CheckFailed(f"{name}: {pname} got no gradient through the fused modules")
        err = ((q.grad - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-12)).item()
        if err > 1e-4:
            raise CheckFailed(f"{name}: the gradient of {pname} differs from eager PyTorch by {err:.1e} "
                              "(relative to its largest entry; allowed 1e-4; norm weights not all ones)")
    eager.zero_grad(set_to_none=True)
    fused.zero_grad(set_to_none=True)
    # What the fused block keeps for backward: no more than the reference fused modules keep.
    kept = call_learner(_block0_activation_bytes, fused, idx, targets, what=f"the fused {name} forward")
    needed = _block0_activation_bytes(reference.use_fused_kernels(copy.deepcopy(eager)), idx, targets)
    if kept > needed:
        raise CheckFailed(f"{name}: block 0 keeps {kept:,} bytes of activations for backward with your "
                          f"fused modules, the fused kernels need {needed:,}: RMSNorm keeps x and rstd, SwiGLU "
                          "keeps gate_up (silu(gate) is recomputed in backward, not saved)")
    return eager, fused


# ------------------------------------------------------------------------------------ savings

def measured_savings(cfg, batch: int, seq: int, dtype: torch.dtype, use_fused_kernels) -> int:
    """Activation bytes autograd saves in block 0, eager minus fused (memfit.training.saved_tensors)."""
    from memfit.gpt import GPT
    from memfit.training import random_batch
    torch.manual_seed(0)
    eager = GPT(cfg).to(device=memfit.DEVICE, dtype=dtype)
    fused = use_fused_kernels(copy.deepcopy(eager))
    idx, targets = random_batch(cfg, batch, seq, memfit.DEVICE, seed=0)
    return _block0_activation_bytes(eager, idx, targets) - _block0_activation_bytes(fused, idx, targets)


@dataclass(frozen=True)
class SavingsCase:
    config: str
    batch: int
    seq: int
    dtype: torch.dtype
    hidden: bool

    def axes(self) -> dict:
        return {"dtype": _name(self.dtype), "batch": "1" if self.batch == 1 else "several",
                "config": "GQA, untied" if self.config.startswith("tiny+") or self.config == "tiny" else "MHA, tied",
                "norms per layer": "four (post_norms)" if self.config.endswith("+post_norms") else "two"}


def _savings_config(name: str):
    """A course config by name; "+post_norms": with Gemma-2's norms after attention and the MLP (four a layer)."""
    from memfit.gpt import COURSE_CONFIGS
    base, _, option = name.partition("+")
    return COURSE_CONFIGS[base].scaled(post_norms=True) if option == "post_norms" else COURSE_CONFIGS[base]


SAVINGS_CASES = (
    [SavingsCase("tiny" if i % 2 == 0 else "tiny-mha", 2 if i % 2 == 0 else 1, 16 - i, d, False)
     for i, d in enumerate(DTYPES)]
    + [SavingsCase("tiny-mha" if i % 2 == 0 else "tiny", 1 if i % 2 == 0 else 3, 20 + 13 * i, d, True)
       for i, d in enumerate(DTYPES)]
    + [SavingsCase("tiny+post_norms", 2, 12, DTYPES[0], False), SavingsCase("tiny-mha+post_norms", 1, 18, DTYPES[-1], True)])


def check_fusion_savings(fusion_savings_per_layer, use_fused_kernels, cases: str = "visible") -> None:
    """The learner's formula against the bytes the memory meter sees fusion save in a forward pass. The savings
    are measured with the reference use_fused_kernels and kernels, not the learner's: this check grades the
    formula alone, so a broken fused GPT loses fused_gpt's points and not these too."""
    for case in _plan(SAVINGS_CASES, cases):
        _savings_case(fusion_savings_per_layer, _savings_config(case.config), f"course-{case.config.replace('+', ' with ')}",
                      case.batch, case.seq, case.dtype)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            cfg = drawn_gpt(d).scaled(post_norms=d["post_norms"])
            _savings_case(fusion_savings_per_layer, cfg, cfg.name + (" with post_norms" if d["post_norms"] else ""),
                          d["batch"], d["seq"], BY_NAME[d["dtype"]])
        grade_drawn(savings_domain(), "fusion_savings", DRAWN_SAVINGS_CASES, check_one)


def savings_domain() -> dict:
    """Every call the text allows on a small GPT (activation_bytes' models), post_norms or not, each dtype."""
    return {**gpt_domain(), "post_norms": Choice(False, True), "batch": Sizes(1, 3, edges=(1,)),
            "seq": Sizes(1, 40, edges=(1,)), "dtype": Choice(*DTYPE_NAMES)}


DRAWN_SAVINGS_CASES = 3


def _savings_case(fusion_savings_per_layer, cfg, name: str, batch: int, seq: int, dtype) -> None:
    want = measured_savings(cfg, batch, seq, dtype, reference.use_fused_kernels)
    nbytes = torch.empty((), dtype=dtype).element_size()
    what = f"fusion_savings_per_layer({name}, batch={batch}, seq={seq}, dtype_bytes={nbytes})"
    got = call_learner(fusion_savings_per_layer, cfg, batch, seq, nbytes, what=what)
    if got != want:
        raise CheckFailed(f"{what}: measured {want:,} bytes saved per layer ({want / (batch * seq):g} per token), "
                          f"you returned {got!r}")


# ------------------------------------------------------------------------------------------- axes

AXES = {
    "pow4_numerics": {"rank": (1, 2, 3), "n_vs_block": ("less than one block", "whole blocks", "a partial last block"),
                      "dtype": DTYPE_NAMES, "out": ("None", "given"), "layout": ("contiguous", "every other row"),
                      "values": ("normal", "edge")},
    "pow4_memory": {"dtype": DTYPE_NAMES, "out": ("None", "given")},
    "rmsnorm_forward": {"path": ("numerics", "memory"), "rank": (1, 2, 3),
                        "h": ("1", "a power of two", "not a power of two"), "layout": LAYOUTS,
                        "dtype": DTYPE_NAMES, "magnitude": tuple(MAGNITUDES), "eps": (EPS, 1e-2)},
    "rmsnorm_backward": {"path": ("numerics", "memory"), "rank": (1, 2, 3),
                         "h": ("1", "a power of two", "not a power of two"), "layout": LAYOUTS,
                         "dtype": DTYPE_NAMES, "magnitude": ("normal", "large"),
                         "rows_vs_programs": ("fewer rows than programs", "a multiple of the programs",
                                              "not a multiple of the programs"),
                         "dy_layout": ("x's", "another"), "eps": (EPS, 1e-2, 0.1), "signs": ("mixed", "cancelling"),
                         "weight": ("x's dtype", "fp32")},
    "swiglu": {"path": ("numerics", "memory"), "rank": (1, 2, 3),
               "f_vs_block": ("less than one block", "whole blocks", "a partial last block"), "operands": OPERANDS,
               "dtype": DTYPE_NAMES, "magnitude": ("normal", "large")},
    "fused_gpt": {"norm_weights": ("not ones",), "measured": ("gradients", "loss curve", "activations kept")},
    "fusion_savings": {"dtype": DTYPE_NAMES, "batch": ("1", "several"), "config": ("GQA, untied", "MHA, tied"),
                       "norms per layer": ("two", "four (post_norms)")},
}

_RECORDS = {"pow4_numerics": (POW4_CASES,), "pow4_memory": (POW4_MEMORY_CASES,),
            "rmsnorm_forward": (RMS_CASES, RMS_MEMORY_CASES),
            "rmsnorm_backward": (RMS_BACKWARD_CASES, RMS_BACKWARD_MEMORY_CASES),
            "swiglu": (SWIGLU_CASES, SWIGLU_MEMORY_CASES), "fused_gpt": (GPT_CASES,),
            "fusion_savings": (SAVINGS_CASES,)}


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases` ("visible" or "hidden"), each as {axis: value}: read from the same
    records the check iterates over."""
    return [record.axes() for records in _RECORDS[check] for record in _plan(records, cases)]


CHECKS = [
    Check("pow4_numerics", 2, check_pow4_numerics, uses=("pow4",)),
    Check("pow4_memory", 1, check_pow4_memory, uses=("pow4",)),
    Check("rmsnorm_forward", 2, check_rmsnorm_forward, uses=("rmsnorm_forward",)),
    Check("rmsnorm_backward", 3, check_rmsnorm_backward, uses=("rmsnorm_forward", "rmsnorm_backward")),
    Check("swiglu", 3, check_swiglu, uses=("swiglu_forward", "swiglu_backward")),
    Check("fused_gpt", 2, check_fused_gpt, uses=("use_fused_kernels",), timeout_s=300),
    Check("fusion_savings", 2, check_fusion_savings, uses=("fusion_savings_per_layer", "use_fused_kernels")),
]

KERNELS = [
    KernelSpec("pow4_kernel", "pow4", {"a_ptr": "*{dtype}", "b_ptr": "*{dtype}", "n": "i32"}),
    KernelSpec("rmsnorm_forward_kernel", "rmsnorm",
               {"x_ptr": "*{dtype}", "w_ptr": "*{dtype}", "y_ptr": "*{dtype}", "rstd_ptr": "*fp32", "stride": "i32",
                "n_cols": "i32", "eps": "fp32"}),
    KernelSpec("rmsnorm_backward_kernel", "rmsnorm",
               {"dy_ptr": "*{dtype}", "x_ptr": "*{dtype}", "w_ptr": "*{dtype}", "rstd_ptr": "*fp32", "dx_ptr": "*{dtype}",
                "dw_ptr": "*fp32", "stride": "i32", "n_rows": "i32", "n_cols": "i32", "rows_per_program": "i32"}),
    KernelSpec("swiglu_forward_kernel", "swiglu",
               {"g_ptr": "*{dtype}", "u_ptr": "*{dtype}", "h_ptr": "*{dtype}", "stride_g": "i32", "stride_u": "i32",
                "n_cols": "i32"}),
    KernelSpec("swiglu_backward_kernel", "swiglu",
               {"dh_ptr": "*{dtype}", "g_ptr": "*{dtype}", "u_ptr": "*{dtype}", "d_ptr": "*{dtype}",
                "stride_g": "i32", "stride_u": "i32", "n_cols": "i32"}),
]
