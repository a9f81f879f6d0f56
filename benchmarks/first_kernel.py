"""Lesson 00 benchmark: the reference scaled_add against its peers, bandwidth against the copy ceiling.

Peers in the same run: eager PyTorch `x + alpha * y` (two kernels and a temporary), `torch.add(x, y,
alpha=alpha)` (PyTorch's own fused kernel) and torch.compile of the expression. Bytes moved are the
fewest possible: read x, read y, write out.
"""
from __future__ import annotations

import torch

from course.notebook_loader import load_solution
from memfit.meter import measure_peak
from memfit.timing import median_ms

GiB = 1 << 30


def copy_ceiling_tbps(nbytes: int = 4 * GiB) -> float:
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / ms / 1e9


def run() -> dict:
    ref = load_solution("00_first_kernel")
    rows = []
    ceiling = copy_ceiling_tbps()
    compiled = torch.compile(lambda x, y, a: x + a * y)
    for dtype in (torch.float32, torch.bfloat16):
        n = GiB // torch.empty((), dtype=dtype).element_size()  # 1 GiB per tensor
        x, y = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        moved = 3 * n * x.element_size()
        impls = {
            "reference scaled_add (Triton)": lambda: ref.scaled_add(x, y, 0.5),
            "eager x + alpha*y": lambda: x + 0.5 * y,
            "torch.add(x, y, alpha=)": lambda: torch.add(x, y, alpha=0.5),
            "torch.compile": lambda: compiled(x, y, 0.5),
        }
        for name, fn in impls.items():
            _, mem = measure_peak(fn)
            ms = median_ms(fn)
            rows.append(dict(impl=name, dtype=str(dtype).replace("torch.", ""), n=n, ms=round(ms, 4),
                             tbps=round(moved / ms / 1e9, 3), of_copy_ceiling=round(moved / ms / 1e9 / ceiling, 3),
                             peak_extra_mib=round(mem.peak_bytes / 2**20, 1)))
        del x, y
        torch.cuda.empty_cache()
    return dict(title="Lesson 00: scaled_add, 1 GiB per tensor (bytes moved = read x + read y + write out)",
                copy_ceiling_tbps=round(ceiling, 3), rows=rows)


def markdown(result: dict) -> str:
    lines = [f"### {result['title']}", "", f"Copy ceiling (4 GiB device-to-device, read + write): "
             f"{result['copy_ceiling_tbps']} TB/s", "",
             "| implementation | dtype | time (ms) | TB/s | of copy ceiling | peak extra (MiB) |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['impl']} | {r['dtype']} | {r['ms']} | {r['tbps']} | {r['of_copy_ceiling']:.0%} | {r['peak_extra_mib']} |"
              for r in result["rows"]]
    return "\n".join(lines)
