"""A contract of every call the memory meter measures: the work lives in tensors, where the meter counts it.

The course's meters count tensors (memfit.meter). A call can hide its memory from them by doing the work in another
library: the N x V logits computed in NumPy on a host copy, a dequantized weight as an array. So while a meter
measures, call_learner traces the process's host allocations (tracemalloc: NumPy's arrays and Python's own buffers)
during the learner's call, and the most alive at once must stay under HOST_ALLOWANCE. Three kinds of work are left
out, as the process's and not the call's: a Triton launch (a compile on a GPU, Triton's interpreter emulating the
kernel's tiles on a CPU), a module's first import (PyTorch imports torch._dynamo, and sympy with it, on first use
of some operations: tens of MiB of code objects), and each PyTorch operation the live-tensor meter sees (its own
bookkeeping of every storage, and the tensor objects handed back: tensors are that meter's to count).

HOST_ALLOWANCE is far above what Python objects need (the references' host peaks are a few KiB, tests/test_host_memory)
and below the smallest array the memory checks' cases would need to hold a tensor-sized temporary on the host.
"""
from __future__ import annotations

import builtins
import contextlib
import importlib
import tracemalloc

from memfit.meter import LiveTensorMeter, format_bytes, measuring

HOST_ALLOWANCE = 256 * 1024  # bytes of NumPy arrays and Python buffers a measured call may hold at once


def _launchers():
    """The classes whose `run` launches a Triton kernel: compiled (JITFunction) and interpreted."""
    from triton.runtime.jit import JITFunction
    from triton.runtime.interpreter import InterpretedFunction
    return JITFunction, InterpretedFunction


@contextlib.contextmanager
def host_peak(what: str, on_excess):
    """Trace the host allocations of the block when measure_peak measures it (and nothing traces already); after
    it, call on_excess(message) when their peak, outside the work left out (above), passed HOST_ALLOWANCE."""
    if not measuring() or tracemalloc.is_tracing():  # (a warm-up call is not traced: tracing costs time)
        yield
        return
    peaks = [0]  # the most traced at once outside the left-out work, above the base
    depth, base, before = [0], [0], [0]
    saved = [(cls, "run", cls.__dict__["run"]) for cls in _launchers()]
    saved += [(LiveTensorMeter, "__torch_dispatch__", LiveTensorMeter.__dict__["__torch_dispatch__"])]
    saved += [(builtins, "__import__", builtins.__import__), (importlib, "import_module", importlib.import_module)]

    def outside() -> None:
        peaks[0] = max(peaks[0], tracemalloc.get_traced_memory()[1] - base[0])

    def left_out(original):
        def work(*args, **kwargs):
            if depth[0] == 0:
                outside()
                before[0] = tracemalloc.get_traced_memory()[0]
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:  # what the work allocated, at its height and still held after, is the process's
                    tracemalloc.reset_peak()
                    base[0] += tracemalloc.get_traced_memory()[0] - before[0]
        return work

    tracemalloc.start(1)
    base[0] = tracemalloc.get_traced_memory()[0]
    for owner, name, original in saved:
        setattr(owner, name, left_out(original))
    try:
        yield
        outside()
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
        tracemalloc.stop()
    if peaks[0] > HOST_ALLOWANCE:
        on_excess(f"{what} held {format_bytes(peaks[0])} of NumPy arrays or Python buffers at once (allowed: "
                  f"{format_bytes(HOST_ALLOWANCE)}): keep the work in tensors, where the memory meter counts it, "
                  "and make no array of the problem's size in NumPy or any other library")
