"""Checks of lesson 00 (solutions/00_first_kernel.ipynb): bytes of a tensor; a masked Triton kernel.

Each check iterates over a plan of case records (BYTES_CASES, ADD_CASES, INVALID_CASES, MEMORY_CASES, GPU_CASES);
AXES lists what the exercises' text lets vary and case_axes reads the same records. No exercise of this lesson
calls another (scaled_add launches its own kernel; it never needs bytes_of), so none is graded through a
reference of another.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import memfit
from autograder.checks import Check, KernelSpec, CheckFailed, CheckSkipped, call_learner, check_cases, select, skip
from autograder.checks.domain import Choice, Impossible, Sizes, grade_drawn
from autograder.checks.numerics import (assert_close_by_rule, call_pure, check_guards, dtype_name,
                                        expect_like, expect_no_torch_arithmetic, guarded_allocations, guarded_empty,
                                        overlaps, seeded_generator, unchanged_arguments)
from memfit.meter import LIVE_TENSORS, LiveTensorMeter, format_bytes, measure_peak


_plan = select  # (autograder/checks/__init__.py: one planner for every check module)


# ----------------------------------------------------------------------------------- bytes_of

BYTES_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int64, torch.bool,
                torch.complex64)
# bytes_of may create a 0-d tensor to ask its element size (the hint), nothing as large as the tensor itself.
BYTES_OF_ALLOWED = 16


@dataclass(frozen=True)
class BytesCase:
    shape: tuple
    dtype: torch.dtype
    as_size: bool = False  # the shape passed as a torch.Size (what x.shape gives), else a tuple

    def size(self) -> str:
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        if not self.shape:
            return "empty shape ()"
        if 0 in self.shape:
            return "a zero dimension"
        if nbytes >= 2 ** 31:
            return "over 2**31 bytes"
        count = math.prod(self.shape)  # (a count past 2**24 that float32 rounds: a float product is off)
        return "a count float32 cannot hold" if int(np.float32(count)) != count else "ordinary"

    def axes(self) -> dict:
        return {"rank": len(self.shape), "dtype": dtype_name(self.dtype), "size": self.size(),
                "shape_type": "torch.Size" if self.as_size else "tuple"}


BYTES_CASES = {
    "visible": [BytesCase((4096, 4096), torch.float32), BytesCase((3, 5), torch.float16, as_size=True),
                BytesCase((), torch.bfloat16), BytesCase((2, 0, 3), torch.float64), BytesCase((5,), torch.int8),
                BytesCase((2, 3, 4), torch.int64, as_size=True), BytesCase((10,), torch.bool),
                BytesCase((65536, 32768), torch.bfloat16), BytesCase((4, 4), torch.complex64),
                BytesCase((4097, 4099), torch.int8)],
    "hidden": [BytesCase((128256, 4096), torch.bfloat16), BytesCase((), torch.float16), BytesCase((3, 0, 5), torch.bfloat16),
               BytesCase((7,), torch.int8), BytesCase((2, 3), torch.float64, as_size=True),
               BytesCase((1000,), torch.bool), BytesCase((8, 8), torch.int64), BytesCase((3, 7), torch.complex64),
               BytesCase((0,), torch.float32), BytesCase((1, 1, 1), torch.float16, as_size=True),
               BytesCase((131072, 8192), torch.float32, as_size=True), BytesCase((16_777_217,), torch.bool)],
}


def _true_bytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def bytes_domain() -> dict:
    """Any shape of rank 0 to 4 with any sizes (0, 1, and counts past 2**24, 2**31 and 2**53, where float32, int32
    and float64 arithmetic fail), every dtype, given as a tuple or a torch.Size."""
    return {"rank": Choice(1, 0, 2, 3, 4), "dim": Sizes(0, 2**56, edges=(0, 1, 2, 4097, 16_777_217, 2**31 + 1, 2**53 + 1)),
            "other_dims": Sizes(0, 8192, edges=(0, 1, 3, 4096)), "dtype": Choice(*(dtype_name(d) for d in BYTES_DTYPES)),
            "as_size": Choice(False, True)}


DRAWN_BYTES_CASES = 120


def _drawn_bytes_case(case: dict) -> BytesCase:
    dtype = next(d for d in BYTES_DTYPES if dtype_name(d) == case["dtype"])
    shape = (case["dim"],) + (case["other_dims"],) * (case["rank"] - 1) if case["rank"] else ()
    if math.prod(shape) * dtype.itemsize >= 2**62:  # no tensor has that many bytes: PyTorch counts them in int64
        raise Impossible()
    return BytesCase(shape, dtype, case["as_size"])


def check_bytes_of(bytes_of, cases: str = "visible") -> None:
    for case in _plan(BYTES_CASES, cases):
        _check_bytes(bytes_of, case)
    if check_cases(cases)[1]:
        grade_drawn(bytes_domain(), "bytes_of", DRAWN_BYTES_CASES,
                    lambda drawn: _check_bytes(bytes_of, _drawn_bytes_case(drawn)))


def _check_bytes(bytes_of, case: BytesCase) -> None:
    shape = torch.Size(case.shape) if case.as_size else tuple(case.shape)
    what = f"bytes_of({shape}, {case.dtype})"
    call_learner(bytes_of, shape, case.dtype, what=what)  # (outside the meter: the contracts' decoy calls)
    with LiveTensorMeter() as meter:  # counts tensors created by the call, on any device (meta excluded)
        got = call_learner(bytes_of, shape, case.dtype, what=what)
    if meter.peak > BYTES_OF_ALLOWED:
        raise CheckFailed(f"{what} allocated {format_bytes(meter.peak)} to answer: compute the bytes from the "
                          "shape and the element size without allocating the tensor")
    want = _true_bytes(case.shape, case.dtype)
    if not isinstance(got, int) or isinstance(got, bool):
        raise CheckFailed(f"{what} should return an int, got {type(got).__name__} {got!r}")
    if got != want:
        raise CheckFailed(f"{what}: expected {want:,} bytes, got {got:,}")


# --------------------------------------------------------------------------------- scaled_add

OPERANDS = ("separate tensors", "views into one buffer", "the same tensor", "strides differ on a size-1 dim")
ALPHAS = ("zero", "positive", "negative")
MAGNITUDES = {"unit": 1.0, "large": 1000.0, "with inf and nan": 1.0}  # the last: IEEE specials in x and y
BLOCK_FIT = ("one element", "less than a block", "whole blocks", "a partial last block")


def _block() -> int:
    return memfit.config("scaled_add")["BLOCK"]


def _block_fit(numel: int) -> str:
    block = _block()
    if numel == 1:
        return "one element"
    if numel < block:
        return "less than a block"
    return "whole blocks" if numel % block == 0 else "a partial last block"


@dataclass(frozen=True)
class AddCase:
    """One numerics case: scaled_add(x, y, alpha) into a guarded out=, then with out=None."""
    shape: tuple
    dtype_index: int  # into memfit.profile().dtypes (modulo their number): every dtype the machine grades
    alpha: str  # ALPHAS
    operands: str  # OPERANDS
    magnitude: str = "unit"  # MAGNITUDES

    def dtype(self) -> torch.dtype:
        dtypes = memfit.profile().dtypes
        return dtypes[self.dtype_index % len(dtypes)]

    def axes(self, again: bool) -> dict:
        return {"rank": len(self.shape), "block_fit": _block_fit(math.prod(self.shape)), "dtype": dtype_name(self.dtype()),
                "alpha": self.alpha, "operands": self.operands, "magnitude": self.magnitude,
                "out": ("given", "None"), "arguments": "valid",
                "call": "same shape and dtype again" if again else "first of its shape and dtype"}


def _add_cases() -> dict:
    b = _block()
    return {
        "visible": [AddCase((1,), 0, "positive", "separate tensors"),
                    AddCase((), 1, "zero", "the same tensor"),
                    AddCase((17,), 2, "negative", "views into one buffer", "large"),
                    AddCase((2, b), 0, "positive", "separate tensors"),
                    AddCase((b + 5, 1), 1, "negative", "strides differ on a size-1 dim"),
                    AddCase((2, 3, b // 6 + 1), 2, "zero", "separate tensors", "large"),
                    AddCase((17,), 2, "positive", "separate tensors"),
                    AddCase((23,), 0, "zero", "separate tensors", "with inf and nan")],
        "hidden": [AddCase((1,), 1, "negative", "views into one buffer"),
                   AddCase((), 2, "positive", "separate tensors", "large"),
                   AddCase((b - 1,), 0, "zero", "separate tensors"),
                   AddCase((4, b), 1, "negative", "the same tensor"),
                   AddCase((3, 7, b // 5 + 3), 2, "positive", "separate tensors"),
                   AddCase((4 * b + 1, 1), 0, "positive", "strides differ on a size-1 dim", "large"),
                   AddCase((16 * b + 3,), 1, "negative", "separate tensors"),
                   AddCase((b - 1,), 0, "negative", "views into one buffer", "large"),
                   AddCase((2, 9), 1, "zero", "views into one buffer", "with inf and nan")],
    }


def _operands(case: AddCase, seed: int):
    """x, y and alpha for a case; drawn on the CPU (the same numbers on every device), then moved."""
    gen = seeded_generator(seed)
    n, dtype, device = math.prod(case.shape), case.dtype(), memfit.DEVICE
    scale = MAGNITUDES[case.magnitude]
    draw = lambda *shape: (scale * torch.randn(*shape, generator=gen)).to(dtype=dtype, device=device)
    if case.operands == "separate tensors":
        x, y = draw(n).view(case.shape), draw(n).view(case.shape)
    elif case.operands == "views into one buffer":  # two storage offsets into one storage
        buffer = draw(2 * n + 3)
        x, y = buffer[1:n + 1].view(case.shape), buffer[n + 3:].view(case.shape)
    elif case.operands == "the same tensor":
        x = draw(n).view(case.shape)
        y = x
    else:  # contiguous, but x's stride on its size-1 dim is not y's
        rows, one = case.shape
        x, y = draw(one, rows).t(), draw(rows, one)
        assert x.is_contiguous() and x.stride() != y.stride()
    if case.magnitude == "with inf and nan":  # 0 * inf and inf - inf are nan, x + 0 * y is not always x
        xs, ys = x.view(-1), y.view(-1)
        ys[0::5], ys[1::7], xs[2::3] = math.inf, math.nan, -math.inf
    magnitude = float(torch.empty(()).uniform_(0.25, 2.0, generator=gen))
    alpha = {"zero": 0.0, "positive": magnitude, "negative": -magnitude}[case.alpha]
    return x, y, alpha


def _describe(case_shape, dtype, alpha: float, operands: str = "separate tensors", magnitude: str = "unit") -> str:
    how = {"separate tensors": "", "views into one buffer": " (x and y views into one buffer)",
           "the same tensor": " (y is x)", "strides differ on a size-1 dim": " (x = a (1, n) tensor transposed)"}
    return (f"scaled_add(x, y, alpha={alpha:.4f}) with x and y of shape {tuple(case_shape)} "
            f"({math.prod(case_shape):,} elements), {dtype_name(dtype)}" + how[operands]
            + (", some elements inf, -inf or nan" if magnitude == "with inf and nan" else ""))


def _check_one(scaled_add, x, y, alpha: float, what: str, earlier: dict | None = None) -> None:
    """out= (a NaN-filled tensor with guard regions on both sides), then out=None (every tensor the learner
    allocates guarded); inputs unchanged, the result a new tensor, nothing read or written out of bounds."""
    exact = x.double() + alpha * y.double()
    torch_same = x + alpha * y
    # Any right order in the working dtype (alpha rounded to it, the product rounded, the sum rounded) is within
    # 1.5 eps of |x| + |alpha*y| per element; PyTorch's own error on one draw can be far smaller (x and alpha*y that
    # cancel), so that alone would fail a right kernel on an unlucky draw.
    bound = 2 * torch.finfo(x.dtype).eps * (x.double().abs() + abs(alpha) * y.double().abs()).flatten()
    out = guarded_empty(tuple(x.shape), x.dtype, x.device)
    with guarded_allocations():
        got = call_pure(scaled_add, x, y, alpha, out=out, what=what + ", out=", writable=("out",))
    check_guards(out, what + ", out=")
    if got is not out:
        raise CheckFailed(f"{what}: with out= given, scaled_add must write into it and return it")
    assert_close_by_rule(out, exact, torch_same, what + " (into out=)", bound=bound)
    with guarded_allocations():
        got = call_pure(scaled_add, x, y, alpha, what=what)
    assert_close_by_rule(got, exact, torch_same, what, bound=bound)
    if earlier is None:
        return
    key = (tuple(x.shape), x.dtype)
    if key in earlier:
        before, values = earlier[key]
        if overlaps(got, before) or not torch.equal(before.nan_to_num(), values.nan_to_num()):
            raise CheckFailed(f"{what}: the result shares memory with the result of an earlier call of the same shape "
                              "(this call overwrote it): allocate a new output on every call, keep none between calls")
    earlier[key] = (got, got.clone())


@dataclass(frozen=True)
class InvalidCase:
    """Arguments scaled_add must refuse with ValueError (the exercise: same shape, dtype, device; contiguous)."""
    kind: str

    def axes(self) -> dict:
        return {"arguments": self.kind}


INVALID_KINDS = ("shapes differ", "same numel, other shape", "dtypes differ", "x not contiguous", "y not contiguous",
                 "out of another dtype", "out not contiguous") + (("devices differ",) if torch.cuda.is_available() else ())
INVALID_CASES = {"visible": [InvalidCase(kind) for kind in INVALID_KINDS],
                 "hidden": [InvalidCase(kind) for kind in INVALID_KINDS]}


def _invalid_arguments(kind: str, seed: int):
    """(x, y, out) for one kind of bad call; every tensor large enough that a kernel that runs anyway stays in bounds."""
    gen = seeded_generator(seed)
    device = memfit.DEVICE
    dtypes = memfit.profile().dtypes
    dtype = dtypes[seed % len(dtypes)]
    draw = lambda *shape, dt=dtype: torch.randn(*shape, generator=gen).to(dtype=dt, device=device)
    x, y, out = draw(4, 6), draw(4, 6), None
    if kind == "shapes differ":
        y = draw(4, 7)
    elif kind == "same numel, other shape":
        y = draw(6, 4)
    elif kind == "dtypes differ":
        y = draw(4, 6, dt=torch.float16 if dtype != torch.float16 else torch.float32)
    elif kind == "x not contiguous":
        x = draw(6, 4).t()
    elif kind == "y not contiguous":
        y = draw(4, 12)[:, ::2]
    elif kind == "out of another dtype":
        out = draw(4, 6, dt=torch.float16 if dtype != torch.float16 else torch.float32)
    elif kind == "out not contiguous":
        out = draw(4, 12)[:, ::2]
    elif kind == "devices differ":
        y = y.cpu()
    else:
        raise ValueError(f"unknown kind of invalid call {kind!r}")
    return x, y, out


def _check_refused(scaled_add, kind: str, seed: int) -> None:
    x, y, out = _invalid_arguments(kind, seed)
    what = (f"scaled_add(x, y, 0.5{'' if out is None else ', out=out'}) with {kind} (x: {tuple(x.shape)} "
            f"{dtype_name(x.dtype)} on {x.device.type}, y: {tuple(y.shape)} {dtype_name(y.dtype)} on {y.device.type}"
            + ("" if out is None else f", out: {tuple(out.shape)} {dtype_name(out.dtype)}") + ")")
    kwargs = {} if out is None else {"out": out}
    try:
        with unchanged_arguments((x, y, out), what):
            scaled_add(x, y, 0.5, **kwargs)
    except ValueError:
        return
    except NotImplementedError:
        call_learner(scaled_add, x, y, 0.5, what=what, **kwargs)  # reports the stub
    except (CheckFailed, CheckSkipped):
        raise
    except Exception as exc:
        raise CheckFailed(f"{what} raised {type(exc).__name__}: check the inputs before launching and raise "
                          f"ValueError when {kind}") from None
    raise CheckFailed(f"{what} returned a value: check the inputs before launching and raise ValueError when {kind}")


def add_domain() -> dict:
    """Every valid call the exercise allows: any rank, sizes around the block, each dtype, alpha, operand layout and
    magnitude (autograder/checks/domain.py draws hidden cases from it)."""
    b = _block()
    return {"n": Sizes(1, 3 * b + 7, edges=(1, 2, b - 1, b, b + 1, 2 * b + 1)), "rank": Choice(1, 2, 3, 0),
            "lead": Sizes(1, 6), "dtype": Choice(*(dtype_name(d) for d in memfit.profile().dtypes)),
            "alpha": Choice("positive", "negative", "zero"), "operands": Choice(*OPERANDS),
            "magnitude": Choice(*MAGNITUDES)}


def _drawn_add_case(case: dict) -> AddCase:
    if case["operands"] == "strides differ on a size-1 dim":
        if case["n"] < 2:  # a (1, 1) tensor's strides are the same either way
            raise Impossible()
        shape = (case["n"], 1)
    else:
        shape = {0: (), 1: (case["n"],), 2: (case["lead"], case["n"]), 3: (case["lead"], 2, case["n"])}[case["rank"]]
    dtype_index = [dtype_name(d) for d in memfit.profile().dtypes].index(case["dtype"])
    return AddCase(shape, dtype_index, case["alpha"], case["operands"], case["magnitude"])


DRAWN_ADD_CASES = 8


def check_scaled_add_numerics(scaled_add, cases: str = "visible") -> None:
    earlier: dict = {}
    for seed, case in enumerate(_plan(_add_cases(), cases)):
        x, y, alpha = _operands(case, seed)
        _check_one(scaled_add, x, y, alpha, _describe(case.shape, case.dtype(), alpha, case.operands, case.magnitude), earlier)
    for seed, case in enumerate(_plan(INVALID_CASES, cases)):
        _check_refused(scaled_add, case.kind, seed)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            case = _drawn_add_case(drawn)
            x, y, alpha = _operands(case, drawn["seed"])
            _check_one(scaled_add, x, y, alpha, _describe(case.shape, case.dtype(), alpha, case.operands, case.magnitude))
        grade_drawn(add_domain(), "scaled_add_numerics", DRAWN_ADD_CASES, check_one)


# ------------------------------------------------------------------------------------- memory

# A result the call returns is not kept memory, but the CUDA allocator rounds each block up to 512 bytes.
KEPT_ALLOWED = 512


@dataclass(frozen=True)
class MemoryCase:
    shape: tuple
    dtype_index: int
    out: str  # "None" (scaled_add allocates its output) or "given"
    operands: str = "separate tensors"  # or "the same tensor" (y is x: the text allows it)

    def dtype(self) -> torch.dtype:
        dtypes = memfit.profile().dtypes
        return dtypes[self.dtype_index % len(dtypes)]

    def axes(self) -> dict:
        return {"dtype": dtype_name(self.dtype()), "out": self.out, "rank": len(self.shape),
                "block_fit": _block_fit(math.prod(self.shape)), "kept": "after the call", "operands": self.operands,
                "size": "less than one block" if math.prod(self.shape) < _block() else "many blocks"}


def _memory_cases() -> dict:
    """Every graded dtype on both call paths, crossed between visible and hidden; sizes no numerics case uses
    (a result cached by shape would hide in a size seen before)."""
    dtypes = range(len(memfit.profile().dtypes))
    # (each large enough that host copies of x and y in NumPy pass the host allowance: the visible cases show it)
    visible_shapes = [(70_001,), (3, 46_669), (2, 70_003)]
    hidden_shapes = [(5, 28_001), (140_009,), (3, 46_673)]
    # and, measured with them: y is x (nothing to copy), and a size below one block (no call too small to launch:
    # the arithmetic is the kernel's at every size)
    return {"visible": [MemoryCase(visible_shapes[i], i, ("None", "given")[i % 2]) for i in dtypes]
            + [MemoryCase((70_007,), 1, "given", "the same tensor"), MemoryCase((17,), 0, "None")],
            "hidden": [MemoryCase(hidden_shapes[i], i, ("given", "None")[i % 2]) for i in dtypes]
            + [MemoryCase((2, 35_011), 0, "None", "the same tensor"), MemoryCase((3, 5), 1, "given")]}


ALLOCATOR_SLACK = 1024  # bytes a call may use beyond its output: the CUDA allocator rounds a block up to 512


def _memory_budget(out_bytes: int, out_given: bool) -> int:
    """The output (none with out= given: it exists already) and ALLOCATOR_SLACK. A fixed slack, not a share of the
    output: the budgets of calls measured together add up, and a share of a large call's output would hide a small
    call's padded output or copy."""
    return (0 if out_given else out_bytes) + ALLOCATOR_SLACK


def _memory_call(case_shape, dtype: torch.dtype, out_given: bool, operands: str, seed: int):
    """(x, y, alpha, out, what) of one measured call; operands "the same tensor": y is x."""
    gen = seeded_generator(seed)
    x = torch.randn(case_shape, generator=gen).to(dtype=dtype, device=memfit.DEVICE)
    y = x if operands == "the same tensor" else torch.randn(case_shape, generator=gen).to(dtype=dtype, device=memfit.DEVICE)
    out = torch.empty_like(x) if out_given else None
    what = (f"scaled_add at shape {tuple(case_shape)} ({math.prod(case_shape):,} elements), {dtype_name(dtype)}, "
            + ("out= given" if out_given else "out=None") + (", y is x" if operands == "the same tensor" else ""))
    return x, y, 0.75, out, what


def _measure(scaled_add, calls: list, meter=None, warmup: bool = True):
    """measure_peak of the calls made one after the other (their results kept): (results, report)."""
    def run():
        return [call_learner(scaled_add, x, y, alpha, what=what, **({} if out is None else {"out": out}))
                for x, y, alpha, out, what in calls]
    return measure_peak(run, device=memfit.DEVICE, meter=meter, warmup=warmup)


def _check_memory(scaled_add, group: list[tuple]) -> None:
    """group: (shape, dtype, out_given) of calls measured together, as one function (one warm-up, one meter
    run: the meter's fixed cost is paid once). Their budgets add up: each call with out=None may allocate its
    output, one with out= given nothing. When the sum is exceeded, each call is measured alone to say which."""
    calls = [_memory_call(*one, seed=1234 + i) for i, one in enumerate(group)]
    results, report = _measure(scaled_add, calls)
    budget, outputs = 0, 0
    for (x, _, _, out, what), got in zip(calls, results):
        if out is not None and got is not out:
            raise CheckFailed(f"{what}: with out= given, scaled_add must write into it and return it")
        expect_like(got, x, what)
        out_bytes = got.numel() * got.element_size()
        budget += _memory_budget(out_bytes, out is not None)
        outputs += 0 if out is not None else out_bytes
    names = "; ".join(what for *_, what in calls)
    if report.peak_bytes > budget:
        if len(calls) > 1:
            _each_alone(scaled_add, group)
        elif calls[0][3] is not None:
            raise CheckFailed(f"{names}: peak extra memory {format_bytes(report.peak_bytes)} ({report.meter}) exceeds "
                              f"the budget {format_bytes(budget)} (nothing beyond {format_bytes(ALLOCATOR_SLACK)} of allocator rounding): "
                              "out exists already, so compute straight into it and allocate nothing")
        else:
            raise CheckFailed(f"{names}: peak extra memory {format_bytes(report.peak_bytes)} ({report.meter}) exceeds "
                              f"the budget {format_bytes(budget)} (the output, {format_bytes(outputs)}, + {format_bytes(ALLOCATOR_SLACK)}): "
                              "compute in one kernel without temporaries")
        raise CheckFailed(f"{names}: peak extra memory {format_bytes(report.peak_bytes)} ({report.meter}) exceeds "
                          f"the budget {format_bytes(budget)} (the outputs scaled_add allocates, "
                          f"{format_bytes(outputs)}, + {format_bytes(ALLOCATOR_SLACK)} a call): compute in one kernel without "
                          "temporaries, and straight into out= when it is given")
    if report.kept_bytes > KEPT_ALLOWED:
        raise CheckFailed(f"{names}: {format_bytes(report.kept_bytes)} still allocated after scaled_add returned, "
                          "beyond its result (allowed: none): keep no tensor alive between calls (an output or "
                          "scratch cached in a global is memory the caller can never free)")
    if report.meter != LIVE_TENSORS:  # only the live-tensor meter records the ops the call dispatched
        _, report = _measure(scaled_add, calls, meter=LIVE_TENSORS, warmup=False)
    try:
        expect_no_torch_arithmetic(report.ops, names, "the sum must be computed by your Triton kernel")
    except CheckFailed:
        if len(calls) > 1:
            _each_alone(scaled_add, group)
        raise


def _each_alone(scaled_add, group: list[tuple]) -> None:
    """Which call of a failing group: each measured alone raises its own message."""
    for one in group:
        _check_memory(scaled_add, [one])


def check_scaled_add_memory(scaled_add, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for which in ("visible",) * visible + ("hidden",) * hidden:
        _check_memory(scaled_add, [(case.shape, case.dtype(), case.out == "given", case.operands)
                                   for case in _plan(_memory_cases(), which)])
    if hidden:
        def check_one(d: dict) -> None:
            shape = (d["n"],) if d["rank"] == 1 else (d["rows"], -(-d["n"] // d["rows"]))
            _check_memory(scaled_add, [(shape, getattr(torch, d["dtype"]), d["out"] == "given", d["operands"])])
        grade_drawn(add_memory_domain(), "scaled_add_memory", DRAWN_ADD_MEMORY_CASES, check_one)


def add_memory_domain() -> dict:
    """Every call the text allows, measured: any size (below a block, a partial last block, many), rank 1 or 2, each
    graded dtype, out= given or not, y a separate tensor or x itself."""
    return {"n": Sizes(1, 200_000, edges=(1, _block() - 1, _block() + 1)), "rank": Choice(1, 2),
            "rows": Sizes(1, 7, edges=(1,)), "dtype": Choice(*(dtype_name(d) for d in memfit.profile().dtypes)),
            "out": Choice("None", "given"), "operands": Choice("separate tensors", "the same tensor")}


DRAWN_ADD_MEMORY_CASES = 3


# ------------------------------------------------------------------------------------ the GPU

@dataclass(frozen=True)
class GpuCase:
    shape: tuple
    dtype_index: int

    def dtype(self) -> torch.dtype:
        dtypes = memfit.profile().dtypes
        return dtypes[self.dtype_index % len(dtypes)]

    def axes(self) -> dict:
        return {"dtype": dtype_name(self.dtype()), "rank": len(self.shape),
                "block_fit": _block_fit(math.prod(self.shape)), "out": ("given", "None"),
                "memory": ("out=None", "out= given", "kept after the call")}


def _gpu_cases() -> dict:
    """Every dtype at GPU scale (about 16M elements, a partial last block), rank 1 and 2 crossed between visible
    and hidden."""
    n = memfit.size("first_kernel")["n_check_large"]
    side = math.isqrt(n)
    shapes = {"visible": [(n,), (side + 2, side - 3)], "hidden": [(side + 6, side - 5), (n + 2 * _block() + 2,)]}
    return {which: [GpuCase(shapes[which][i % 2], i) for i in range(len(memfit.profile().dtypes))]
            for which in ("visible", "hidden")}


def check_scaled_add_gpu(scaled_add, cases: str = "visible") -> None:
    """The compiled kernel at GPU scale: numerics in every dtype the card has, memory by the CUDA allocator."""
    if not torch.cuda.is_available():
        return skip("skipped: needs a GPU (checks the compiled kernel on ~16M elements, "
                    "memory measured by the CUDA allocator)")
    plan = _plan(_gpu_cases(), cases)
    for seed, case in enumerate(plan):
        _gpu_case(scaled_add, case.shape, case.dtype(), 100 + seed)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            shape = (d["n"],) if d["rank"] == 1 else (d["rows"], -(-d["n"] // d["rows"]))
            _gpu_case(scaled_add, shape, getattr(torch, d["dtype"]), d["seed"])
        n = memfit.size("first_kernel")["n_check_large"]
        grade_drawn({"n": Sizes(1, 2 * n, edges=(1, _block() - 1, _block() + 1, n)), "rank": Choice(1, 2),
                     "rows": Sizes(1, 4096, edges=(1,)), "dtype": Choice(*(dtype_name(d) for d in memfit.profile().dtypes))},
                    "scaled_add_gpu", DRAWN_GPU_CASES, check_one)
    print(f"scaled_add: GPU checks passed ({', '.join(dtype_name(c.dtype()) for c in plan)}, "
          f"shapes {', '.join(str(c.shape) for c in plan)})")


DRAWN_GPU_CASES = 4  # any size up to twice the fixed cases' ~16M elements, rank 1 or 2, each dtype the card has


def _gpu_case(scaled_add, shape: tuple, dtype: torch.dtype, seed: int) -> None:
    gen = seeded_generator(seed)
    x = torch.randn(shape, generator=gen).to(dtype=dtype, device=memfit.DEVICE)
    y = torch.randn(shape, generator=gen).to(dtype=dtype, device=memfit.DEVICE)
    alpha = float(torch.empty(()).uniform_(-2, 2, generator=gen))
    _check_one(scaled_add, x, y, alpha, _describe(shape, dtype, alpha))
    del x, y
    fresh = shape[:-1] + (shape[-1] + 1,)  # a shape the numerics did not use: a cache would show
    _check_memory(scaled_add, [(fresh, dtype, False, "separate tensors"), (fresh, dtype, True, "separate tensors")])


# ------------------------------------------------------------------------------------------- axes

AXES = {
    "bytes_of": {"rank": (0, 1, 2, 3), "dtype": tuple(dtype_name(d) for d in BYTES_DTYPES),
                 "size": ("empty shape ()", "a zero dimension", "ordinary", "a count float32 cannot hold",
                          "over 2**31 bytes"),
                 "shape_type": ("tuple", "torch.Size")},
    "scaled_add_numerics": {"rank": (0, 1, 2, 3), "block_fit": BLOCK_FIT,
                            "dtype": tuple(dtype_name(d) for d in memfit.profile().dtypes), "alpha": ALPHAS,
                            "operands": OPERANDS, "magnitude": tuple(MAGNITUDES), "out": ("given", "None"),
                            "arguments": ("valid",) + INVALID_KINDS,
                            "call": ("first of its shape and dtype", "same shape and dtype again")},
    "scaled_add_memory": {"dtype": tuple(dtype_name(d) for d in memfit.profile().dtypes), "out": ("None", "given"),
                          "rank": (1, 2), "block_fit": ("a partial last block",), "kept": ("after the call",),
                          "operands": ("separate tensors", "the same tensor"), "size": ("less than one block", "many blocks")},
    "scaled_add_gpu": {"dtype": tuple(dtype_name(d) for d in memfit.profile().dtypes), "rank": (1, 2),
                       "block_fit": ("a partial last block",), "out": ("given", "None"),
                       "memory": ("out=None", "out= given", "kept after the call")},
}


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases` ("visible" or "hidden"), each as {axis: value}: read from the same
    records the check iterates over."""
    if check == "bytes_of":
        return [case.axes() for case in _plan(BYTES_CASES, cases)]
    if check == "scaled_add_numerics":
        seen, result = set(), []
        for case in _plan(_add_cases(), cases):
            key = (case.shape, case.dtype())
            result.append(case.axes(again=key in seen))
            seen.add(key)
        return result + [case.axes() for case in _plan(INVALID_CASES, cases)]
    if check == "scaled_add_memory":
        return [case.axes() for case in _plan(_memory_cases(), cases)]
    if check == "scaled_add_gpu":
        return [case.axes() for case in _plan(_gpu_cases(), cases)]
    raise KeyError(f"lesson 00 has no check {check!r}")


CHECKS = [
    Check("bytes_of", 2, check_bytes_of, uses=("bytes_of",)),
    Check("scaled_add_numerics", 4, check_scaled_add_numerics, uses=("scaled_add",)),
    Check("scaled_add_memory", 2, check_scaled_add_memory, uses=("scaled_add",)),
    Check("scaled_add_gpu", 2, check_scaled_add_gpu, uses=("scaled_add",), needs_gpu=True),
]

KERNELS = [
    KernelSpec("scaled_add_kernel", "scaled_add",
               {"x_ptr": "*{dtype}", "y_ptr": "*{dtype}", "out_ptr": "*{dtype}", "n": "i32", "alpha": "fp32"}),
]
