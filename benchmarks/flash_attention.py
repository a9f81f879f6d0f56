"""Lesson 05 benchmark: the reference FlashAttention (solutions/05_flash_attention.ipynb, extracted to
memfit.from_lessons.flash_attention) against PyTorch's scaled_dot_product_attention with its FlashAttention
backend and with cuDNN's, in one run on one GPU.

* Speed: B=4, H=32, bf16, N in 4096, 8192, 16384, head dims 64 and 128, causal and not. TFLOP/s count the
  forward as 4·B·H·N²·d (half with a causal mask) and forward + backward as 3.5 times that. Each figure is the
  median of three medians of triton.testing.do_bench, the implementations measured in turn, so that a drift
  of the clock during the run touches all of them alike.
* Memory: peak extra bytes of forward + backward (CUDA allocator, memfit.measure_peak) at B=1, H=16, d=64,
  bf16, causal, for naive attention, the reference and SDPA's flash backend.
* Tiles (`--sweep`): the candidates for memfit.hardware's table at N=4096, forward alone and backward alone.

    python -m benchmarks.flash_attention [--sweep]
"""
from __future__ import annotations

import contextlib
import statistics
import sys

import torch
import torch.nn.functional as F

import memfit
from memfit.meter import measure_peak
from memfit.timing import kernel_ms, median_ms

BATCH, HEADS = 4, 32
SEQS = (4096, 8192, 16384)
HEAD_DIMS = (64, 128)
MEMORY_SEQS = (1024, 2048, 4096, 8192)
SWEEP = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages); the first of each is the entry before the H200 sweep
    "flash_forward": [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 4), (128, 128, 8, 2),
                      (64, 64, 4, 3)],
    "flash_dkdv": [(64, 64, 4, 2), (32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 4, 5), (64, 64, 4, 4),
                   (128, 128, 8, 2)],
    "flash_dq": [(64, 64, 4, 2), (128, 32, 4, 3), (128, 64, 8, 2), (128, 32, 4, 5), (128, 64, 8, 3),
                 (64, 64, 4, 4)],
}


def _flops(n: int, d: int, causal: bool, backward: bool) -> float:
    return 4 * BATCH * HEADS * n * n * d * (0.5 if causal else 1) * (3.5 if backward else 1)


def _sdpa(backend, causal):
    from torch.nn.attention import sdpa_kernel

    def attend(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attend


def _interleaved(fns: dict, rounds: int = 3) -> dict:
    """Median over rounds of each fn's median ms, the fns taken in turn within a round."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_ms(fn, warmup_ms=100, rep_ms=400))
    return {name: statistics.median(t) for name, t in times.items()}


def _speed(ref) -> list[dict]:
    from torch.nn.attention import SDPBackend
    rows = []
    for d in HEAD_DIMS:
        for n in SEQS:
            for causal in (False, True):
                q, k, v, do = (torch.randn(BATCH, HEADS, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
                impls = {"reference": lambda q, k, v: ref.flash_attention(q, k, v, causal),
                         "SDPA flash": _sdpa(SDPBackend.FLASH_ATTENTION, causal),
                         "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION, causal)}
                fwd, fwd_bwd = {}, {}
                for name, attend in impls.items():
                    try:
                        attend(q, k, v)
                    except RuntimeError as exc:  # a backend this GPU or build lacks
                        print(f"{name} unavailable: {exc}", file=sys.stderr)
                        continue
                    fwd[name] = lambda attend=attend: attend(q, k, v)

                    def train(attend=attend):
                        for t in leaves:
                            t.grad = None
                        attend(*leaves).backward(do)
                    fwd_bwd[name] = train
                for label, fns, backward in (("forward", fwd, False), ("forward + backward", fwd_bwd, True)):
                    ms = _interleaved(fns)
                    tflops = {name: _flops(n, d, causal, backward) / t / 1e9 for name, t in ms.items()}
                    rows.append(dict(pass_=label, n=n, d=d, causal=causal, ms={k: round(v, 4) for k, v in ms.items()},
                                     tflops={k: round(v, 1) for k, v in tflops.items()},
                                     vs_flash=round(tflops["reference"] / tflops["SDPA flash"], 3),
                                     vs_cudnn=round(tflops["reference"] / tflops["SDPA cuDNN"], 3)
                                     if "SDPA cuDNN" in tflops else None))
                    print(rows[-1], flush=True)
                torch.cuda.empty_cache()
    return rows


def _memory(ref) -> list[dict]:
    from torch.nn.attention import SDPBackend
    rows = []
    impls = {"naive": lambda q, k, v: ref.naive_attention(q, k, v, causal=True),
             "reference": lambda q, k, v: ref.flash_attention(q, k, v, True),
             "SDPA flash": _sdpa(SDPBackend.FLASH_ATTENTION, True)}
    for n in MEMORY_SEQS:
        row = dict(n=n)
        for name, attend in impls.items():
            q, k, v = (torch.randn(1, 16, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn(1, 16, n, 64, device="cuda", dtype=torch.bfloat16)
            _, report = measure_peak(lambda: attend(q, k, v).backward(do))
            row[name] = report.peak_bytes
            torch.cuda.empty_cache()
        rows.append(row)
        print(row, flush=True)
    return rows


@contextlib.contextmanager
def _tiles(kernel: str, variant: str, tiles: tuple[int, int, int, int]):
    """memfit.hardware's entry for this GPU replaced by `tiles` while the block runs."""
    from memfit.hardware import KERNEL_CONFIGS
    rows = KERNEL_CONFIGS[kernel]
    entry = rows[memfit.profile().name if memfit.profile().name in rows else "gpu"][variant]
    saved = dict(entry)
    entry.update(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), tiles))
    try:
        yield
    finally:
        entry.clear()
        entry.update(saved)


def sweep() -> list[dict]:
    import memfit.from_lessons.flash_attention as ref
    rows, n = [], 4096
    for d in HEAD_DIMS:
        variant = "d64" if d <= 64 else "d128"
        for causal in (False, True):
            q, k, v, do = (torch.randn(BATCH, HEADS, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            o, lse = ref.flash_attention_forward(q, k, v, causal)
            for kernel, candidates in SWEEP.items():
                for tiles in candidates:
                    with _tiles(kernel, variant, tiles):
                        if kernel == "flash_forward":
                            fn = lambda: ref.flash_attention_forward(q, k, v, causal)  # noqa: E731
                        else:
                            fn = lambda: ref.flash_attention_backward(do, q, k, v, o, lse, causal)  # noqa: E731
                        try:
                            ms = median_ms(fn, warmup_ms=50, rep_ms=300)
                        except Exception as exc:  # noqa: BLE001  (out of shared memory, for instance)
                            ms = None
                            print(f"{kernel} {tiles}: {type(exc).__name__}", file=sys.stderr)
                    rows.append(dict(kernel=kernel, d=d, causal=causal, tiles=list(tiles),
                                     ms=None if ms is None else round(ms, 4)))
                    print(rows[-1], flush=True)
    return rows


def _profile(ref, n: int = 8192) -> list[dict]:
    """Device ms of each kernel in one forward + backward (torch.profiler), causal, at N = n: where the time goes."""
    from torch.nn.attention import SDPBackend
    rows = []
    for d in HEAD_DIMS:
        q, k, v, do = (torch.randn(BATCH, HEADS, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        for name, attend in (("reference", lambda q, k, v: ref.flash_attention(q, k, v, True)),
                             ("SDPA cuDNN", _sdpa(SDPBackend.CUDNN_ATTENTION, True))):
            def train(attend=attend):
                for t in leaves:
                    t.grad = None
                attend(*leaves).backward(do)
            try:
                rows.append(dict(n=n, d=d, causal=True, impl=name, kernels_ms=kernel_ms(train)))
            except RuntimeError as exc:  # a backend this GPU or build lacks
                print(f"{name} unavailable: {exc}", file=sys.stderr)
                continue
            print(rows[-1], flush=True)
        del q, k, v, do, leaves
        torch.cuda.empty_cache()
    return rows


def run() -> dict:
    import memfit.from_lessons.flash_attention as ref
    torch.manual_seed(0)
    return dict(title="Lesson 05: FlashAttention against PyTorch's SDPA (flash and cuDNN backends)",
                speed=_speed(ref), memory=_memory(ref), profile=_profile(ref))


def markdown(result: dict) -> str:
    mib = 2 ** 20
    lines = [f"### {result['title']}", ""]
    if result["speed"]:
        lines += [f"B={BATCH}, H={HEADS}, bf16; TFLOP/s = 4·B·H·N²·d (x0.5 causal, x3.5 with backward) / time; "
                  "each figure the median of 3 interleaved do_bench medians.", "",
                  "| pass | N | d | causal | reference | SDPA flash | SDPA cuDNN | ours / flash | ours / cuDNN |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["speed"]:
        t = r["tflops"]
        cudnn = f"{t['SDPA cuDNN']:.0f}" if "SDPA cuDNN" in t else "n/a"
        versus = f"{r['vs_cudnn']:.2f}x" if r["vs_cudnn"] is not None else "n/a"
        lines.append(f"| {r['pass_']} | {r['n']} | {r['d']} | {'yes' if r['causal'] else 'no'} | "
                     f"{t['reference']:.0f} | {t['SDPA flash']:.0f} | {cudnn} | {r['vs_flash']:.2f}x | {versus} |")
    if result["memory"]:
        lines += ["", "Peak extra memory of forward + backward, B=1, H=16, d=64, bf16, causal (MiB):", "",
                  "| N | naive | reference | SDPA flash |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['n']} | {r['naive'] / mib:,.0f} | {r['reference'] / mib:,.0f} | {r['SDPA flash'] / mib:,.0f} |"
              for r in result["memory"]]
    if result.get("profile"):
        lines += ["", "Where the time goes: device ms of each kernel in one forward + backward (torch.profiler), B=4, "
                  "H=32, bf16, causal:", "", "| N | d | implementation | kernels, ms |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['n']} | {r['d']} | {r['impl']} | {sum(r['kernels_ms'].values()):.2f} in all: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in list(r["kernels_ms"].items())[:5]) + " |"
                  for r in result["profile"]]
    if result.get("sweep"):
        lines += ["", "Tile sweep at N=4096 (ms; forward alone for flash_forward, the whole backward otherwise; "
                  "tiles = BLOCK_M, BLOCK_N, warps, stages):", "",
                  "| kernel | d | causal | tiles | ms |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['kernel']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {tuple(r['tiles'])} | "
                  f"{r['ms'] if r['ms'] is not None else 'failed'} |" for r in result["sweep"]]
    return "\n".join(lines)


if __name__ == "__main__":  # this lesson alone: python -m benchmarks.flash_attention [--sweep]
    from benchmarks.record import record_one
    if "--sweep" in sys.argv:
        record_one("flash_attention", note="tile sweep for memfit.hardware's flash entries", part="sweep",
                   run=lambda: dict(title="Lesson 05: tile sweep", speed=[], memory=[], sweep=sweep()))
    else:
        record_one("flash_attention", note="the reference and both SDPA backends measured in this one run")
