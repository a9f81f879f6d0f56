"""A contract of every call the memory meter measures: the work lives in tensors, where the meter counts it.

The course's meters count tensors (memfit.meter). A call can hide its memory from them by doing the work in another
library: the N x V logits computed in NumPy on a host copy, a dequantized weight as an array. So while a meter
measures, call_learner traces the process's host allocations (tracemalloc: NumPy's arrays and Python's own buffers)
during the learner's call, and the most alive at once must stay under HOST_ALLOWANCE. Three kinds of work are left
out, as the process's and not the call's: a Triton launch (a compile on a GPU, Triton's interpreter emulating the
kernel's tiles on a CPU; tracing pauses during it, _Trace says how), a module's first import (PyTorch imports torch._dynamo, and sympy with it, on first use
of some operations: tens of MiB of code objects), and each PyTorch operation the live-tensor meter sees (its own
bookkeeping of every storage, and the tensor objects handed back: tensors are that meter's to count).

HOST_ALLOWANCE is far above what Python objects need (the references' host peaks are a few KiB, tests/test_host_memory)
and below the smallest array the memory checks' cases would need to hold a tensor-sized temporary on the host.
"""
from __future__ import annotations

import builtins
import contextlib
import importlib
import os
import tracemalloc

from memfit.meter import LiveTensorMeter, format_bytes, measuring

HOST_ALLOWANCE = 256 * 1024  # bytes of NumPy arrays and Python buffers a measured call may hold at once


CARRIED_BLOCK = 4096  # bytes: a block this large or larger, alive when tracing pauses, is carried past the pause


def _launchers():
    """The classes whose `run` launches a Triton kernel: compiled (JITFunction) and interpreted."""
    from triton.runtime.jit import JITFunction
    from triton.runtime.interpreter import InterpretedFunction
    return JITFunction, InterpretedFunction


def _libraries() -> tuple[str, ...]:
    """Where the process's own code lives (the standard library, installed packages but NumPy, the course's meter):
    a block allocated there, by an import or the meter's bookkeeping, is not the learner's work."""
    import numpy
    import sysconfig
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(roots)) + ("<frozen ", LiveTensorMeter.__torch_dispatch__.__code__.co_filename), \
        os.path.dirname(numpy.__file__)


_LIBRARIES, _NUMPY = _libraries()


def _the_call_s(trace: tracemalloc.Trace) -> bool:
    """Whether a block was allocated by the learner's code or by NumPy (not by an import, a library, the meter)."""
    where = trace.traceback[0].filename
    return where.startswith(_NUMPY) or not where.startswith(_LIBRARIES)


class _Trace:
    """The host bytes a call holds, traced in spans between Triton launches.

    Tracing is paused during a launch: tracemalloc would see every allocation of Triton's interpreter (which doubles
    a kernel's time in the interpreter) and the launch is left out anyway. tracemalloc restarts empty after a pause,
    so what the call held when it paused is carried: every block of CARRIED_BLOCK bytes or more then alive, counted as
    held until the call returns (an upper bound: one freed later still counts), unless a library allocated it (an
    import inside a PyTorch operation, the meter's bookkeeping: _the_call_s). Smaller Python objects (a launch's
    arguments, a tuple) are not carried, so a loop of thousands of launches does not add up to the allowance; holding
    the allowance in pieces under 4 KiB across launches goes unseen, a cost this contract accepts for its speed."""

    def __init__(self):
        self.peak = 0  # the most held at once, outside the left-out work
        self.carried = 0  # bytes held before the last pause (blocks of CARRIED_BLOCK or more)
        self.base = 0  # bytes of this span held by left-out work that ran in it (imports, the meter's dispatch)

    def start(self) -> None:
        tracemalloc.start(1)
        self.base = tracemalloc.get_traced_memory()[0]

    def note_peak(self) -> None:
        self.peak = max(self.peak, self.carried + tracemalloc.get_traced_memory()[1] - self.base)

    def pause(self) -> None:
        self.note_peak()
        if tracemalloc.get_traced_memory()[0] - self.base >= CARRIED_BLOCK:  # (no snapshot when nothing that large)
            traces = tracemalloc.take_snapshot().traces
            self.carried += sum(t.size for t in traces if t.size >= CARRIED_BLOCK and _the_call_s(t))
        tracemalloc.stop()


@contextlib.contextmanager
def host_peak(what: str, on_excess):
    """Trace the host allocations of the block when measure_peak measures it (and nothing traces already); after
    it, call on_excess(message) when their peak, outside the work left out (above), passed HOST_ALLOWANCE."""
    if not measuring() or tracemalloc.is_tracing():  # (a warm-up call is not traced: tracing costs time)
        yield
        return
    trace = _Trace()
    depth, before = [0], [0]
    launches = [(cls, "run", cls.__dict__["run"]) for cls in _launchers()]
    process_work = [(LiveTensorMeter, "__torch_dispatch__", LiveTensorMeter.__dict__["__torch_dispatch__"]),
                    (builtins, "__import__", builtins.__import__), (importlib, "import_module", importlib.import_module)]

    def paused(original):  # a launch: not traced at all
        def launch(*args, **kwargs):
            if depth[0] > 0:
                return original(*args, **kwargs)
            trace.pause()
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
                trace.start()
        return launch

    def left_out(original):  # traced, and what it holds after is the process's (it runs often, or rarely and big)
        def work(*args, **kwargs):
            if depth[0] > 0:
                return original(*args, **kwargs)
            trace.note_peak()
            before[0] = tracemalloc.get_traced_memory()[0]
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
                tracemalloc.reset_peak()
                trace.base += tracemalloc.get_traced_memory()[0] - before[0]
        return work

    trace.start()
    for owner, name, original in launches:
        setattr(owner, name, paused(original))
    for owner, name, original in process_work:
        setattr(owner, name, left_out(original))
    try:
        yield
        trace.note_peak()
    finally:
        for owner, name, original in launches + process_work:
            setattr(owner, name, original)
        tracemalloc.stop()
    if trace.peak > HOST_ALLOWANCE:
        on_excess(f"{what} held {format_bytes(trace.peak)} of NumPy arrays or Python buffers at once (allowed: "
                  f"{format_bytes(HOST_ALLOWANCE)}): keep the work in tensors, where the memory meter counts it, "
                  "and make no array of the problem's size in NumPy or any other library")
