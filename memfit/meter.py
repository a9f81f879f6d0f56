"""The course's one memory meter.

`measure_peak(fn, *args)` runs `fn` and reports the peak of extra memory it needed, in bytes,
above what was allocated before the call:

* on a GPU, from the CUDA caching allocator's count of the bytes the program asked for
  (`requested_bytes`: reset before, synchronize after, baseline subtracted, optionally after a
  warm-up call that takes lazy initialisation out of the figure). The allocator's own rounding
  (to 512 bytes) and the unused tail of a cached block it hands out again (up to 1 MiB per tensor)
  depend on what ran before the call, not on the call: they are left out of the figure;
* on a CPU, from a live-tensor meter: a TorchDispatchMode that sees every tensor PyTorch creates
  during the call and counts the bytes of each storage until the last tensor using it dies.

The live-tensor meter works on GPU tensors too, which is how a test proves that the two meters
agree. Graded code cannot reset the meter: while it runs, PyTorch's reset functions raise.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CUDA_ALLOCATOR = "cuda-allocator"
LIVE_TENSORS = "live-tensors"


class MeterTampered(RuntimeError):
    """Raised when measured code tries to reset the peak-memory statistics."""


@dataclass
class MemoryReport:
    peak_bytes: int  # peak extra bytes during the call, above the bytes allocated before it
    meter: str  # CUDA_ALLOCATOR or LIVE_TENSORS
    device: str
    ops: Counter = field(default_factory=Counter)  # aten ops the call dispatched (live meter only)
    largest_bytes: int | None = None  # the largest single storage the call created (live meter only)
    # bytes the call left allocated beyond its result (a scratch cached in a global, a tensor kept on self):
    # the most either call (the warm-up, the measured one) kept
    kept_bytes: int = 0

    def __str__(self) -> str:
        return f"{format_bytes(self.peak_bytes)} peak extra ({self.meter} on {self.device})"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class LiveTensorMeter(TorchDispatchMode):
    """Counts the bytes of storages created while it is active, as long as they stay alive."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}  # id(storage) -> bytes
        self.current = 0
        self.peak = 0
        self.largest = 0  # bytes of the largest storage seen: proves a tensor of some size never existed
        self.ops: Counter = Counter()
        self.paused = 0  # >0 while a Triton interpreter launch runs (see _interpreter_launches_free)

    def _release(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        nbytes = storage.nbytes()
        before = self._live.get(key)
        if before is None:
            self._live[key] = nbytes
            weakref.finalize(storage, self._release, key)
            self.current += nbytes
        elif nbytes != before:  # resized in place (an out= argument that grew)
            self._live[key] = nbytes
            self.current += nbytes - before
        self.peak = max(self.peak, self.current)
        self.largest = max(self.largest, nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        self.ops[str(func.overloadpacket)] += 1
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if _has_storage(t)}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if not _has_storage(t):
                continue
            storage = t.untyped_storage()
            # An output that shares an input's storage (a view, an in-place op) allocates nothing,
            # unless it is one of ours that grew.
            if id(storage) not in inputs or id(storage) in self._live:
                self._track(storage)
        return out


def _has_storage(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta"


_RESET_FUNCTIONS = (
    (torch.cuda, "reset_peak_memory_stats"),
    (torch.cuda, "reset_max_memory_allocated"),
    (torch.cuda, "reset_max_memory_cached"),
    (torch.cuda, "reset_accumulated_memory_stats"),
    (torch.cuda.memory, "reset_peak_memory_stats"),
    (torch.cuda.memory, "reset_max_memory_allocated"),
    (torch.cuda.memory, "reset_accumulated_memory_stats"),
    (torch._C, "_cuda_resetPeakMemoryStats"),
    (torch._C, "_cuda_resetAccumulatedMemoryStats"),
)


_measuring = 0  # > 0 while measure_peak runs the measured code


def _refuse(*_args, **_kwargs):
    raise MeterTampered("the measured code tried to reset the peak-memory statistics; "
                        "remove torch.cuda.reset_peak_memory_stats from your function")


@contextlib.contextmanager
def _resets_forbidden():
    global _measuring
    saved = [(mod, name, getattr(mod, name)) for mod, name in _RESET_FUNCTIONS if hasattr(mod, name)]
    for mod, name, _ in saved:
        setattr(mod, name, _refuse)
    _measuring += 1
    try:
        yield
    finally:
        _measuring -= 1
        for mod, name, original in saved:
            setattr(mod, name, original)


def install_reset_guards() -> None:
    """Wrap PyTorch's reset functions for the rest of the process, so that a reference to one saved before
    measure_peak runs (in a notebook cell, say) raises too while the meter measures. The grader's child calls
    this before it loads a notebook."""
    def guarded(original):
        @functools.wraps(original)
        def reset(*args, **kwargs):
            if _measuring:
                _refuse()
            return original(*args, **kwargs)
        reset.__memfit_guard__ = True
        return reset

    for mod, name in _RESET_FUNCTIONS:
        original = getattr(mod, name, None)
        if original is not None and not getattr(original, "__memfit_guard__", False):
            setattr(mod, name, guarded(original))


@contextlib.contextmanager
def _interpreter_launches_free(meter: LiveTensorMeter):
    """A compiled kernel launch allocates nothing; Triton's interpreter copies every argument
    through PyTorch to emulate device memory. Those copies are the interpreter's, not the
    learner's, so the live-tensor meter pauses while an interpreted launch runs."""
    from memfit.runtime import INTERPRETED
    if not INTERPRETED:
        yield
        return
    from triton.runtime.interpreter import GridExecutor
    launch = GridExecutor.__call__

    def paused_launch(self, *args, **kwargs):
        meter.paused += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            meter.paused -= 1
            # The interpreter's argument copies leave reference cycles (closures over a dict of the arguments'
            # storages) that keep each argument alive until the garbage collector runs: a tile the code has
            # dropped would still count when the next one is allocated. They are young: collect them now.
            gc.collect(1)

    GridExecutor.__call__ = paused_launch
    try:
        yield
    finally:
        GridExecutor.__call__ = launch


def _device_of(args: tuple, kwargs: dict, device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return t.device
    from memfit.runtime import DEVICE
    return DEVICE


def _requested_bytes(dev: torch.device, stat: str = "current") -> int:
    """The bytes the program has asked the CUDA caching allocator for (now, or at the peak since the last reset):
    what its tensors hold, before the allocator rounds a request up or hands out a larger cached block."""
    return torch.cuda.memory_stats(dev)[f"requested_bytes.all.{stat}"]


def _result_bytes(result: Any, made_by_the_call: Callable) -> int:
    """Bytes of the distinct storages the result holds that the call made (its outputs are not kept memory)."""
    seen: dict[int, int] = {}
    for t in tree_leaves(result):
        if _has_storage(t):
            storage = t.untyped_storage()
            if made_by_the_call(storage):
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def measure_peak(fn: Callable, *args, device=None, meter: str | None = None, warmup: bool = True,
                 **kwargs) -> tuple[Any, MemoryReport]:
    """Run fn(*args, **kwargs); return (its result, a MemoryReport of the peak extra bytes).

    meter: CUDA_ALLOCATOR (default for CUDA tensors) or LIVE_TENSORS (default otherwise).
    warmup: call fn once before measuring (lazy handles, workspaces and kernel compilation stay
    out of the figure); its result is dropped before the measured call.
    """
    dev = _device_of(args, kwargs, device)
    meter = meter or (CUDA_ALLOCATOR if dev.type == "cuda" else LIVE_TENSORS)
    if meter == CUDA_ALLOCATOR and dev.type != "cuda":
        raise ValueError("the CUDA allocator meter needs CUDA tensors; "
                         f"these are on {dev} (use meter=LIVE_TENSORS)")
    if dev.type == "cuda":  # cuBLAS's handle and workspace are the process's, not the call's: create them first
        torch.mm(torch.ones(1, 1, device=dev), torch.ones(1, 1, device=dev))
        torch.cuda.synchronize(dev)
    kept_first = 0
    if warmup:
        if meter == CUDA_ALLOCATOR:
            before = _requested_bytes(dev)
            fn(*args, **kwargs)
            gc.collect()
            torch.cuda.synchronize(dev)
            kept_first = _requested_bytes(dev) - before
        else:
            first = LiveTensorMeter()
            with _interpreter_launches_free(first), first:
                fn(*args, **kwargs)
            gc.collect()
            kept_first = first.current
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if meter == CUDA_ALLOCATOR:
        baseline = _requested_bytes(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        with _resets_forbidden():
            result = fn(*args, **kwargs)
            torch.cuda.synchronize(dev)
        peak = _requested_bytes(dev, "peak") - baseline
        gc.collect()
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if _has_storage(t)}
        kept = _requested_bytes(dev) - baseline - _result_bytes(
            result, lambda storage: storage.data_ptr() not in given)
        return result, MemoryReport(peak, CUDA_ALLOCATOR, str(dev), kept_bytes=max(kept_first, kept, 0))
    if meter != LIVE_TENSORS:
        raise ValueError(f"unknown meter {meter!r}: use {CUDA_ALLOCATOR!r} or {LIVE_TENSORS!r}")
    live = LiveTensorMeter()
    with _resets_forbidden(), _interpreter_launches_free(live), live:
        result = fn(*args, **kwargs)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    gc.collect()
    kept = live.current - _result_bytes(result, lambda storage: id(storage) in live._live)
    return result, MemoryReport(live.peak, LIVE_TENSORS, str(dev), live.ops, live.largest, max(kept_first, kept, 0))
