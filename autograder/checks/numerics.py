"""Comparing a learner's tensor with a reference, by the course's rule.

The rule (FlashAttention's): the learner's max error against a float64 reference may be at most
2x the error PyTorch makes computing the same thing in the same dtype, plus a small floor. Before
comparing: shape, dtype and device must match, and no element may be NaN (outputs are poisoned
with NaN before the call, so an element the code never wrote shows up).
"""
from __future__ import annotations

import contextlib

import torch

import memfit
from autograder.checks import CheckFailed
from autograder.checks.contracts import overlaps, spans as _spans, tensors_in as _tensors  # (overlaps: re-exported)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def case_dtypes(hidden: bool) -> tuple[torch.dtype, ...]:
    """Visible cases run in fp32; hidden ones in every dtype this machine's profile supports."""
    return memfit.profile().dtypes if hidden else (torch.float32,)


def training_half() -> torch.dtype:
    """The 16-bit dtype this machine trains in: bf16 where it has bf16 tensor cores, else fp16."""
    return torch.bfloat16 if memfit.profile().bf16_tensor_cores else torch.float16


_draw = 0  # which draw of the cases' random values: 0 is the grader's; make test's draws test tries others (runtime)


_seeds_drawn = 0  # how many seeds the cases drew (runtime): a check that draws none is the same on every draw


def drawn(seed: int) -> int:
    """A case's seed in the current draw: itself in draw 0 (what the grader and the notebook use), another
    reproducible seed in each other draw, so a tolerance is proven on many values and not on the one draw a test saw."""
    global _seeds_drawn
    _seeds_drawn += 1
    return seed if _draw == 0 else seed + 1_000_003 * _draw


def seeds_drawn() -> int:
    return _seeds_drawn


def current_draw() -> int:
    """The draw in force: a value cached from the cases' random inputs belongs to one draw (key it by this)."""
    return _draw


@contextlib.contextmanager
def another_draw(number: int):
    """While active, every case draws its random values with draw `number`'s seeds."""
    global _draw
    before, _draw = _draw, number
    try:
        yield
    finally:
        _draw = before


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded for this case in the current draw."""
    return torch.Generator().manual_seed(drawn(seed))


def seeded_randn(shape, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """The same numbers on every device: drawn on the CPU from a seeded generator, then moved."""
    gen = seeded_generator(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype=dtype, device=memfit.DEVICE)


def expect_like(got, ref: torch.Tensor, what: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{what}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(ref.shape):
        raise CheckFailed(f"{what}: expected shape {tuple(ref.shape)}, got {tuple(got.shape)}")
    if got.dtype != ref.dtype:
        raise CheckFailed(f"{what}: expected dtype {dtype_name(ref.dtype)}, got {dtype_name(got.dtype)}")
    if got.device != ref.device:
        raise CheckFailed(f"{what}: expected a tensor on {ref.device}, got one on {got.device}")


def summation_bound(magnitude: torch.Tensor, terms: int, dtype: torch.dtype) -> torch.Tensor:
    """The largest error of any order of summing `terms` products, per element: γ_n·Σ|t| with γ_n = n·u / (1 - n·u)
    (Higham, Accuracy and Stability of Numerical Algorithms, 2002, §3.1), u the unit roundoff of the accumulation:
    fp32 for fp32 and the 16-bit types (whose rounding of the result the rule's floor covers), fp64 for fp64.
    `magnitude`: the float64 result of the same computation on the inputs' absolute values (Σ|t| per element)."""
    u = 2.0 ** -53 if dtype == torch.float64 else 2.0 ** -24
    gamma = terms * u / (1 - terms * u)
    return gamma * magnitude.detach().to(torch.float64).flatten()


def assert_close_by_rule(got: torch.Tensor, exact: torch.Tensor, torch_same_dtype: torch.Tensor,
                         what: str, floor_ulps: float = 2.0, scale: float | None = None,
                         bound: torch.Tensor | None = None) -> None:
    """got and torch_same_dtype: results in the working dtype; exact: the float64 reference. `scale`: the size of
    the terms whose difference the result is, where they cancel (default: the result's own largest magnitude); the
    floor of a few ulps is relative to it, so a result near zero from large terms is not held to ulps of itself.
    `bound`: a per-element error bound that every right order of the computation meets (`summation_bound`); the
    tolerance of an element is the larger of the rule's and the bound, so a right answer summing in another order than
    PyTorch's keeps its points on every draw of inputs, not only where PyTorch's own error happened to be large."""
    expect_like(got, torch_same_dtype, what)
    got64 = got.detach().to(torch.float64).flatten()
    exact64 = exact.detach().to(torch.float64).flatten()
    unwritten = torch.isnan(got64) & ~torch.isnan(exact64)
    if unwritten.any():
        first = int(unwritten.nonzero()[0])
        raise CheckFailed(f"{what}: {int(unwritten.sum()):,} of {got64.numel():,} output elements are NaN, "
                          f"first at {element(got, first)}: they were never written (check your mask and grid) or "
                          "computed as NaN (an exp that overflowed, -inf minus -inf)")
    if got64.numel() == 0:
        return
    same64 = torch_same_dtype.detach().to(torch.float64).flatten()
    special = ~torch.isfinite(exact64)  # inf and nan where IEEE arithmetic gives them (0 * inf, inf - inf, ...)
    if special.any():
        agree = (torch.isnan(got64) & torch.isnan(exact64)) | (got64 == exact64)
        wrong = special & ~agree
        if wrong.any():
            first = int(wrong.nonzero()[0])
            raise CheckFailed(f"{what}: {int(wrong.sum()):,} elements that IEEE arithmetic makes inf or nan differ, "
                              f"first at {element(got, first)} (expected {exact64[first].item()}, got "
                              f"{got64[first].item()}): compute the formula as written, with no shortcut for special "
                              "values (0 * inf is nan)")
        finite = ~special
        got64, exact64, same64 = got64[finite], exact64[finite], same64[finite]
        bound = None if bound is None else bound.flatten()[finite.to(bound.device)]
        if got64.numel() == 0:
            return
        keep = finite.nonzero().flatten()  # element() names positions in the whole tensor
    else:
        keep = None
    torch_err = (same64 - exact64).abs().max().item()
    scale = max(1.0, exact64.abs().max().item(), scale or 0.0)
    floor = floor_ulps * torch.finfo(got.dtype).eps * scale
    tol = 2 * torch_err + floor
    err = (got64 - exact64).abs()
    limit = torch.full_like(err, tol) if bound is None else torch.clamp(bound.to(err.device), min=tol)
    worst = int((err / limit).argmax())
    if err[worst].item() > limit[worst].item():
        at = worst if keep is None else int(keep[worst])
        why = (f"2 x PyTorch's {dtype_name(got.dtype)} error {torch_err:.3g} + floor {floor:.3g}" if bound is None else
               f"the larger of 2 x PyTorch's {dtype_name(got.dtype)} error {torch_err:.3g} + floor {floor:.3g} and the "
               f"bound of any summation order there, {bound[worst].item():.3g}")
        raise CheckFailed(
            f"{what}: max |error| {err[worst].item():.3g} at {element(got, at)} (expected "
            f"{exact64[worst].item():.6g}, got {got64[worst].item():.6g}) exceeds the tolerance "
            f"{limit[worst].item():.3g} = {why}")


def element(t: torch.Tensor, flat: int) -> str:
    """Where an element sits, by its index in each dimension: "index (0, 1, 17, 5)" (a flat index alone means
    nothing to a learner looking at a (B, H, N, d) tensor)."""
    if t.dim() <= 1:
        return f"index {flat:,}"
    index = []
    for size in reversed(t.shape):
        index.append(flat % size)
        flat //= size
    return f"index ({', '.join(map(str, reversed(index)))})"


def allocated_bytes(*tensor_bytes: int) -> int:
    """The bytes tensors of these sizes occupy where the checks run: on a GPU the CUDA caching allocator rounds
    each allocation up to a multiple of 512 bytes (a 6,154-byte output holds 6,656), which a budget of exact sizes
    plus 5% does not cover for small tensors."""
    if memfit.HAS_GPU:
        return sum(-(-b // 512) * 512 for b in tensor_bytes)
    return sum(tensor_bytes)


# Elements of NaN after an `out` a check passes: an unmasked store of up to one block past the end lands
# here, where the check sees it, instead of in memory that is not ours (a crash, or silent corruption).
GUARD_ELEMENTS = 4096

# Arithmetic a Triton kernel should do itself: seeing one of these ops means PyTorch did the work.
TORCH_ARITHMETIC = frozenset({
    "aten.add", "aten.add_", "aten.add_out", "aten.sub", "aten.rsub", "aten.mul", "aten.mul_", "aten.mul_out",
    "aten.div", "aten.addcmul", "aten.lerp", "aten.where", "aten.mm", "aten.addmm", "aten.pow", "aten.pow_",
    "aten.square", "aten.rsqrt", "aten.sigmoid", "aten.silu", "aten.mean", "aten.exp", "aten.exp2", "aten.bmm",
    "aten.baddbmm", "aten._softmax", "aten.logsumexp", "aten.amax",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention"})


def expect_no_torch_arithmetic(ops, what: str, hint: str = "the math belongs in your kernel") -> None:
    """ops: the op counts the live-tensor meter recorded while the learner's function ran."""
    used = sorted(set(ops) & TORCH_ARITHMETIC)
    if used:
        raise CheckFailed(f"{what}: PyTorch did arithmetic ({', '.join(used)}): {hint}")


@contextlib.contextmanager
def poisoned_allocations():
    """While active, torch.empty and torch.empty_like return floating-point tensors filled with NaN, on any
    device (on a CPU fresh memory is often zero, which hides an element the kernel never wrote)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *args, **kwargs: poison(empty(*args, **kwargs))
    torch.empty_like = lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


# ------------------------------------------------------------------------------- side effects and guards

def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN, -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point and a.element_size() in (2, 4, 8):
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


@contextlib.contextmanager
def unchanged_arguments(args, what: str):
    """CheckFailed when the block (a call refusing its arguments, say) changed a tensor among `args`, even as it
    raised: an argument is checked before anything is written into it."""
    tensors = [t for t in _tensors(args) if t.device.type != "meta"]
    before = [t.detach().clone() for t in tensors]
    try:
        yield
    finally:
        for i, (t, old) in enumerate(zip(tensors, before)):
            if not same_bits(t.detach(), old):
                raise CheckFailed(f"{what}: tensor argument {i + 1} of {len(tensors)} was written into before the call "
                                  "refused its arguments: check every argument before launching or writing anything")


def call_pure(fn, *args, what: str, writable: tuple[str, ...] = (), **kwargs):
    """call_learner, then prove the call had no side effect on its inputs: every tensor argument (positional or
    keyword) holds the same bits as before, and no tensor of the result shares memory with one, except the
    keyword arguments named in `writable` (an `out=` the exercise asks to write into)."""
    from autograder.checks import call_learner
    named = [(f"argument {i + 1}", a) for i, a in enumerate(args)] + [(k, v) for k, v in kwargs.items()
                                                                       if k not in writable]
    inputs = [(name, t) for name, value in named for t in _tensors(value)]
    before = [t.detach().clone() for _, t in inputs]
    result = call_learner(fn, *args, what=what, **kwargs)
    for (name, t), old in zip(inputs, before):
        if not same_bits(t.detach(), old):
            changed = int((t.detach() != old).sum()) if t.dtype != torch.bool else -1
            raise CheckFailed(f"{what}: {name} was changed by the call ({changed:,} elements differ): leave the "
                              "inputs as they were and write results into new tensors (or out=)")
    for out in _tensors(result):
        for name, t in inputs:
            if overlaps(out, t):
                raise CheckFailed(f"{what}: the result shares memory with {name}: return a new tensor, not a "
                                  "view of an input (a caller that changes one would change the other)")
    return result


def _guard_value(dtype: torch.dtype):
    """NaN for floating point, the largest value for integers, True for bool: values a kernel rarely writes."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def guarded_empty(shape, dtype: torch.dtype, device, guard: int = GUARD_ELEMENTS) -> torch.Tensor:
    """An uninitialised-looking tensor (filled with the guard value) inside a larger buffer with `guard` elements
    of the guard value on either side; check_guards(t) later says whether anything was written outside it."""
    n = 1
    for s in shape:
        n *= s
    buffer = torch.full((n + 2 * guard,), _guard_value(dtype), dtype=dtype, device=device)
    t = buffer[guard:guard + n].view(tuple(shape))
    t._memfit_guard = (buffer, guard, n)  # on the tensor: a module-level table would change the grader's state
    return t


def check_guards(t: torch.Tensor, what: str) -> None:
    """CheckFailed when a kernel wrote before the start or past the end of a tensor made by guarded_empty."""
    buffer, guard, n = t._memfit_guard
    fill = _guard_value(buffer.dtype)
    for name, region, first in (("before the start", buffer[:guard], -guard), ("past the end", buffer[guard + n:], n)):
        written = ~torch.isnan(region) if buffer.dtype.is_floating_point else region != fill
        if written.any():
            idx = int(written.nonzero()[0]) + first
            raise CheckFailed(f"{what}: wrote {int(written.sum()):,} elements {name} of an output (out of bounds, "
                              f"at element {idx:,} of {n:,}): mask every load and store with the true size, and "
                              "launch only the programs a partial last block needs")


@contextlib.contextmanager
def guarded_allocations(what: str | None = None):
    """While active, tensors the learner makes with torch.empty/zeros/ones/full (and their _like forms, and
    Tensor.new_empty/new_zeros) sit inside larger buffers with guard elements on both sides; leaving the block
    raises CheckFailed when anything was written outside one. Catches an unmasked store past the end of an
    output the learner allocated, on the GPU too, where the caching allocator's slack would swallow it.
    Empty/new_empty tensors hold the guard value (NaN): an element never written shows. `what` (the call) begins
    the message."""
    made: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
    saved = {name: getattr(torch, name) for name in ("empty", "zeros", "ones", "full", "empty_like", "zeros_like",
                                                     "ones_like", "full_like")}
    tensor_saved = {name: getattr(torch.Tensor, name) for name in ("new_empty", "new_zeros")}
    own = {name for name in tensor_saved if name in vars(torch.Tensor)}  # the rest live on torch._C.TensorBase

    def wrap(allocate, keep_values: bool):
        def make(*args, **kwargs):
            plain = allocate(*args, **kwargs)
            if plain.layout != torch.strided or plain.numel() == 0 or plain.requires_grad:
                return plain
            n, dtype, device = plain.numel(), plain.dtype, plain.device
            guard = GUARD_ELEMENTS
            buffer = saved["full"]((n + 2 * guard,), _guard_value(dtype), dtype=dtype, device=device)
            # the strides the learner's call asked for: empty_like of a transposed view is transposed too
            t = buffer.as_strided(plain.shape, plain.stride(), guard)
            if keep_values:
                t.copy_(plain)
            made.append((t, buffer, guard, n))
            del plain
            return t
        return make

    for name, original in saved.items():  # empty: guard values (NaN); zeros, ones, full: their values
        setattr(torch, name, wrap(original, keep_values="empty" not in name))
    for name, original in tensor_saved.items():
        setattr(torch.Tensor, name, wrap(original, keep_values=name == "new_zeros"))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
        for name, fn in tensor_saved.items():
            if name in own:
                setattr(torch.Tensor, name, fn)
            else:  # leave torch.Tensor's own attributes as they were (the grader fingerprints them)
                delattr(torch.Tensor, name)
    for t, buffer, guard, n in made:
        fill = _guard_value(buffer.dtype)
        for where, region, first in (("before the start", buffer[:guard], -guard),
                                     ("past the end", buffer[guard + n:], n)):
            written = ~torch.isnan(region) if buffer.dtype.is_floating_point else region != fill
            if written.any():
                idx = int(written.nonzero()[0]) + first
                raise CheckFailed(f"{what + ': ' if what else ''}a kernel wrote {int(written.sum()):,} elements "
                                  f"{where} of a tensor of {tuple(t.shape)} ({dtype_name(t.dtype)}) that your code "
                                  f"allocated (out of bounds, at element {idx:,} of {n:,}): mask every load and store "
                                  "with the true size, and launch only the programs a partial last block needs")


def _spans_of_tensors_at(tables: list[torch.Tensor]) -> list[tuple[int, int]]:
    """The spans of the CPU tensors that start at an address one of `tables` holds: a kernel given a table of
    pointers (one launch for many tensors) may read those tensors, and no byte past their ends. They are found among
    the objects the garbage collector tracks, and (as a meter freezes older objects) among those the launching
    frames reach."""
    import gc
    import sys
    addresses = {int(a) for table in tables if table.numel() <= 1 << 20 for a in table.reshape(-1).tolist()}
    if not addresses:
        return []
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()

    def visit(obj, depth):
        if id(obj) in seen or depth > 5:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu" and obj.numel() > 0 and obj.data_ptr() in addresses:
                found[id(obj)] = obj
            if obj.is_leaf and obj.grad is not None:  # (a non-leaf's .grad warns and is None)
                visit(obj.grad, depth + 1)
            return
        if isinstance(obj, dict):
            for key, value in obj.items():
                visit(key, depth + 1)
                visit(value, depth + 1)
        elif isinstance(obj, (list, tuple, set)):
            for item in obj:
                visit(item, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__ != "builtins":
            visit(vars(obj), depth + 1)

    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            visit(obj, 0)
    frame = sys._getframe(1)
    while frame is not None:
        visit(frame.f_locals, 0)
        frame = frame.f_back
    return [_spans(t) for t in found.values()]


@contextlib.contextmanager
def loads_in_bounds(what: str):
    """In Triton's interpreter (a machine without a GPU), CheckFailed after the block when a kernel loaded an element
    outside every tensor its launch was given: an unmasked load past a dimension's end, or programs launched past
    the end of the data. A compiled kernel reading there reads another tensor's memory or faults; the interpreter
    reads whatever lies there, so without this watch such a kernel passes on a CPU. Such a lane is not read (its mask
    is cleared), so the run goes on as a compiled kernel's would. call_learner watches every call of learner code."""
    import memfit
    if not memfit.INTERPRETED:
        yield
        return
    import numpy as np
    from triton.runtime import interpreter
    builder, executor = interpreter.interpreter_builder, interpreter.GridExecutor
    launch, load = executor.__call__, builder.create_masked_load
    # per launch: [spans of its tensors, its 64-bit integer tensors (pointer tables, maybe), spans they point at]
    launches: list[list] = [[[], [], None]]
    strays = [0]

    def watched_launch(self, *args, **kwargs):
        given = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.numel() > 0]
        tables = [a for a in given if a.dtype in (torch.int64, torch.uint64) and a.device.type == "cpu"]
        launches.append([[_spans(a) for a in given], tables, None])
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    def within(addresses, spans):
        inside = np.zeros(addresses.shape, dtype=bool)
        for lo, hi in spans:
            inside |= (addresses >= np.uint64(lo)) & (addresses < np.uint64(hi))
        return inside

    def watched_load(ptrs, mask, other, *rest):
        addresses = ptrs.data.astype(np.uint64)
        current = launches[-1]
        inside = within(addresses, current[0])
        live = np.broadcast_to(mask.data, addresses.shape)
        outside = live & ~inside
        if outside.any() and current[1]:  # a multi-tensor kernel reads tensors whose addresses a table holds
            if current[2] is None:
                current[2] = _spans_of_tensors_at(current[1])
            inside |= within(addresses, current[2])
            outside = live & ~inside
        if outside.any():
            strays[0] += int(outside.sum())
            mask = interpreter.TensorHandle(live & inside, mask.dtype)
        return load(ptrs, mask, other, *rest)

    own = vars(builder).get("create_masked_load")
    executor.__call__, builder.create_masked_load = watched_launch, watched_load
    try:
        yield
    finally:
        executor.__call__ = launch
        if own is None:
            del builder.create_masked_load  # the instance attribute; the class's method shows again
        else:
            builder.create_masked_load = own
    if strays[0]:
        raise CheckFailed(f"{what}: your kernel loaded {strays[0]:,} elements outside every tensor its launch was "
                          "given (reads out of bounds: a load past a dimension's end, or programs launched past the "
                          "end of the data): mask every load with the true sizes, and launch only the programs the "
                          "sizes need")
