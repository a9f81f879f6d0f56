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
