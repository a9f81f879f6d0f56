"""Timing for benchmarks (never for tests): the median of repeated runs after a warm-up."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median milliseconds of fn(). On a GPU, CUDA events through triton.testing.do_bench; on a
    CPU, wall-clock time of repeated calls (warm-up and repetition budgets in milliseconds)."""
    return statistics.median(samples_ms(fn, warmup_ms, rep_ms))


def samples_ms(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100, min_runs: int = 1) -> list[float]:
    """The milliseconds of every timed call of fn(), as median_ms takes them: their spread says how much of a
    difference between two timings this machine can tell from noise. On a CPU, at least min_runs calls are timed
    (do_bench times many on a GPU)."""
    if torch.cuda.is_available():
        import triton.testing
        return [float(t) for t in triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")]
    deadline = time.perf_counter() + warmup_ms / 1e3
    fn()
    while time.perf_counter() < deadline:
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(samples) < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


_EVICT: dict = {}


def graph_device_ms(fn: Callable[[], object], calls: int = 20, evict_bytes: int = 256 << 20) -> float:
    """Device milliseconds of one fn() with the host out of the way (CUDA only): `calls` calls captured in one CUDA
    graph, each after a write of evict_bytes that empties L2 (so a weight is read from memory, as in a model's
    forward), timed by median_ms; the same graph of writes alone is subtracted. What a server running the call
    under CUDA graphs waits; median_ms of the plain call adds Python's and the launches' time where the host is
    slower than the kernel."""
    device = torch.cuda.current_device()
    if device not in _EVICT:
        _EVICT[device] = torch.empty(evict_bytes, dtype=torch.int8, device="cuda")
    evict = _EVICT[device]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for with_fn in (True, False):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                evict.zero_()
                if with_fn:
                    fn()
        graphs.append(graph)
    both, alone = (statistics.median(median_ms(g.replay, warmup_ms=25, rep_ms=200) for _ in range(3)) for g in graphs)
    return (both - alone) / calls


def host_us_per_call(fn: Callable[[], object], calls: int = 1000) -> float:
    """Microseconds of Python per call of fn() (no waiting for the device: the launches queue): the host's cost."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def kernel_ms(fn: Callable[[], object], merge: dict[str, tuple[str, ...]] | None = None) -> dict[str, float]:
    """Device milliseconds of each kernel in one fn() after a warm-up call (torch.profiler, CUDA only), largest
    first: where the time goes, whatever the host. merge: {label: substrings}: kernels whose lowercase name holds one
    of the substrings are summed under the label (cuBLAS's many GEMM kernels as one line, for instance)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.self_device_time_total <= 0:
            continue
        name = next((label for label, tags in (merge or {}).items() if any(t in event.key.lower() for t in tags)),
                    event.key[:60])
        totals[name] = totals.get(name, 0.0) + event.self_device_time_total / 1e3
    return {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
