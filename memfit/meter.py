"""The course's one memory meter.

A meter counts bytes of tensors from the moment it is entered: `meter.current` (alive now), `meter.peak` (the most
alive at once since it was entered or since `meter.reset_peak()`). `open_meter(device)` picks the implementation,
the only place in the library that chooses between a GPU and a CPU way of counting:

* `CudaAllocatorMeter`: the CUDA caching allocator's count of the bytes the program asked for
  (`requested_bytes`; `allocated_bytes`, what `memory_allocated` reports, where a figure is compared with the
  allocator's). The allocator's own rounding (to 512 bytes) and the unused tail of a cached block it hands out
  again (up to 1 MiB per tensor) depend on what ran before, not on the measured code: `requested_bytes` leaves
  them out. cuBLAS's workspace is created when the meter starts and counted apart (`workspace`).
* `LiveTensorMeter`: a TorchDispatchMode that sees every tensor PyTorch creates while it is active and counts the
  bytes of each storage until the last tensor using it dies. It works on any device (the tests compare it with the
  allocator on a GPU); the copies Triton's interpreter makes of a kernel's arguments are not counted.

`measure_peak(fn, *args)` runs `fn` under a meter and reports the peak extra bytes it needed above what was
allocated before the call. Graded code cannot reset a meter: while measure_peak measures, PyTorch's reset
functions raise.
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


_open_meters = 0  # meters entered and not yet left, in this process


def meters_open() -> int:
    """How many meters are measuring now (code that must not add allocations of its own asks)."""
    return _open_meters


def measuring() -> bool:
    """Whether measure_peak is running the call it measures now (not its warm-up)."""
    return _measuring > 0


def _count_open(change: int) -> None:
    global _open_meters
    _open_meters += change


class LiveTensorMeter(TorchDispatchMode):
    """Counts the bytes of storages created while it is active, as long as they stay alive."""

    name = LIVE_TENSORS
    workspace = 0  # the live meter sees no library workspace: it counts tensors

    def __init__(self) -> None:
        super().__init__()
        self._launches_free = None
        self._live: dict[int, int] = {}  # id(storage) -> bytes
        self.current = 0
        self.peak = 0
        self.largest = 0  # bytes of the largest storage seen: proves a tensor of some size never existed
        self.ops: Counter = Counter()
        self.paused = 0  # >0 while a Triton interpreter launch runs (see _interpreter_launches_free)

    def __enter__(self):
        self._launches_free = _interpreter_launches_free(self)
        self._launches_free.__enter__()
        _count_open(+1)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _count_open(-1)
            self._launches_free.__exit__(*exc)

    def reset_peak(self) -> None:
        self.peak = self.current

    def created(self, storage: torch.UntypedStorage, _inputs: set[int]) -> bool:
        """Did the measured code create this storage (and does it still count it)?"""
        return id(storage) in self._live

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


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


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
        del reset.__wrapped__  # functools.wraps would hand graded code the unguarded function
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


def _result_bytes(result: Any, made_by_the_call: Callable) -> int:
    """Bytes of the distinct storages the result holds that the call made (its outputs are not kept memory)."""
    seen: dict[int, int] = {}
    for t in tree_leaves(result):
        if _has_storage(t):
            storage = t.untyped_storage()
            if made_by_the_call(storage):
                seen[id(storage) if _is_fake(t) else storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class CudaAllocatorMeter:
    """Bytes the CUDA caching allocator hands out on one device, counted from when the meter is entered.

    stat: "requested" (the bytes tensors asked for: the course's default) or "allocated" (after the allocator's
    rounding: torch.cuda.memory_allocated)."""

    name = CUDA_ALLOCATOR
    largest = None  # the allocator does not tell which tensor it was, nor which ops ran

    @property
    def ops(self) -> Counter:
        return Counter()

    def __init__(self, device: torch.device, stat: str = "requested") -> None:
        if stat not in ("requested", "allocated"):
            raise ValueError(f"stat must be 'requested' or 'allocated', not {stat!r}")
        self.device, self.stat = device, stat
        self.base = self.workspace = 0

    def _read(self, which: str) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_stats(self.device)[f"{self.stat}_bytes.all.{which}"]

    def __enter__(self) -> CudaAllocatorMeter:
        before = self._read("current")
        _warm_up_cublas(self.device)
        self.base = self._read("current")
        self.workspace = self.base - before
        _count_open(+1)
        return self

    def __exit__(self, *exc) -> bool:
        _count_open(-1)
        return False

    @property
    def current(self) -> int:
        return self._read("current") - self.base

    @property
    def peak(self) -> int:
        return self._read("peak") - self.base

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        _RESET_PEAK(self.device)

    def created(self, storage: torch.UntypedStorage, inputs: set[int]) -> bool:
        """Did the measured code create this storage? (The allocator keeps no owner: any storage not given to it.)"""
        return storage.data_ptr() not in inputs


_RESET_PEAK = torch.cuda.reset_peak_memory_stats  # the meter's own reference, taken before any guard wraps it


def _warm_up_cublas(device: torch.device) -> None:
    """cuBLAS keeps a workspace per handle and stream from its first matmul on (in fp32, and in bf16 for a
    low-precision step): memory of the process, not of what the meter measures. Created here, it is counted apart."""
    # Grad mode on even where the meter starts under no_grad or inference_mode: the warm-up needs a backward.
    with torch.inference_mode(False), torch.enable_grad(), torch.autograd.set_multithreading_enabled(False):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.ones(64, 64, device=device, dtype=dtype, requires_grad=True)
            (a @ a).sum().backward()


def open_meter(device: str | torch.device, meter: str | None = None, stat: str = "requested"):
    """The meter for tensors on `device`: CUDA_ALLOCATOR (the default on a GPU) or LIVE_TENSORS (the default
    elsewhere, and on a GPU when asked for). Enter it around what it measures."""
    device = torch.device(device)
    meter = meter or (CUDA_ALLOCATOR if device.type == "cuda" else LIVE_TENSORS)
    if meter == CUDA_ALLOCATOR:
        if device.type != "cuda":
            raise ValueError("the CUDA allocator meter needs CUDA tensors; "
                             f"these are on {device} (use meter=LIVE_TENSORS)")
        return CudaAllocatorMeter(device, stat)
    if meter == LIVE_TENSORS:
        return LiveTensorMeter()
    raise ValueError(f"unknown meter {meter!r}: use {CUDA_ALLOCATOR!r} or {LIVE_TENSORS!r}")


@contextlib.contextmanager
def _collect_only_new_objects():
    """The collections that free what the measured call left in reference cycles walk only the objects made since
    the meter started (a full gc.collect() walks every object of the process: 0.1-0.2 s in a notebook that holds a
    model and PyTorch's caches). Objects older than the meter are frozen meanwhile: their garbage waits, as it
    would for any collection of the young generations. Where the process froze objects itself (the grader's child
    freezes its imports), unfreezing would undo that: the collections then walk what it left unfrozen."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measure_peak(fn: Callable, *args, device=None, meter: str | None = None, warmup: bool = True,
                 **kwargs) -> tuple[Any, MemoryReport]:
    """Run fn(*args, **kwargs); return (its result, a MemoryReport of the peak extra bytes).

    meter: CUDA_ALLOCATOR (default for CUDA tensors) or LIVE_TENSORS (default otherwise).
    warmup: call fn once before measuring (lazy handles, workspaces and kernel compilation stay
    out of the figure); its result is dropped before the measured call.
    """
    dev = _device_of(args, kwargs, device)
    if dev.type == "cuda":
        gc.collect()  # garbage of earlier code frees its device memory before the measured call needs it
    with _collect_only_new_objects():
        kept_first = 0
        if warmup:
            with open_meter(dev, meter) as first:
                fn(*args, **kwargs)
            gc.collect()
            kept_first = first.current
        with open_meter(dev, meter) as counting:
            counting.reset_peak()
            with _resets_forbidden():
                result = fn(*args, **kwargs)
            peak = counting.peak
        gc.collect()
    # (a fake tensor, FakeTensorMode's, has no address: the live meter, the one that counts those, needs none)
    given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if _has_storage(t) and not _is_fake(t)}
    kept = counting.current - _result_bytes(result, lambda storage: counting.created(storage, given))
    return result, MemoryReport(peak, counting.name, str(dev), counting.ops, counting.largest,
                                max(kept_first, kept, 0))
