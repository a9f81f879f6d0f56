"""Lesson 06 benchmark: the reference fused linear cross-entropy (solutions/06_fused_linear_ce.ipynb, extracted to
memfit.from_lessons.fused_linear_ce) against PyTorch's chain, and against Liger Kernel and Cut Cross-Entropy when
they are installed, in one run on one GPU.

Heads: Gemma-2-2B (8,192 tokens, H=2,304, V=256,000) and Llama-3-8B (8,192 tokens, H=4,096, V=128,256), bf16,
random inputs (W scaled by 1/sqrt(H)), 10% of targets ignored. Each contender runs loss + backward:
* memory: peak bytes during the call above what was allocated before it, gradients included (CUDA allocator,
  memfit.measure_peak after a warm-up call; the warm-up's gradients are freed by the measured call, so they are
  added back), against the bar of 1.05 x (dX + dW);
* time: the median of three medians of triton.testing.do_bench, the contenders measured in turn;
* error: max |loss, dX, dW - those of PyTorch's chain on the same inputs with the loss upcast to fp32|.
The reference also runs with fp32 dW accumulation and at scratch budgets from 1/128 to 1/8 of dX + dW; section 8's
filtered version (the gradient's blocks below 2^-12 skipped) at Cut Cross-Entropy's threshold and at 0 (every block
kept, the block-sparse products at their slowest); Cut Cross-Entropy with its filter and without. Each head also
records the share of blocks the filter keeps (counted on the first 1,024 tokens' whole rows) and, from one
torch.profiler run of loss + backward, the device time of each kernel of the reference, the filtered version and
Cut Cross-Entropy: where the time goes.

    python -m benchmarks.fused_linear_ce
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from memfit.meter import measure_peak
from memfit.timing import kernel_ms, median_ms

CUBLAS = {"cuBLAS matmuls": ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_")}

HEADS = {"Gemma-2-2B": (8192, 2304, 256000), "Llama-3-8B": (8192, 4096, 128256)}
BUDGETS = (128, 64, 32, 16, 8)  # scratch = (dX + dW) / this


def _contenders(ref, x, w, t, grads: int) -> dict:
    def ours(**kwargs):
        if "budget" in kwargs:  # a scratch budget other than chunk_plan's default
            plan = ref.chunk_plan(*x.shape, w.shape[0], x.element_size(), kwargs.pop("budget"))
            return lambda: _Planned.apply(ref, x, w, t, plan)
        return lambda: ref.fused_linear_cross_entropy(x, w, t, **kwargs)

    fns = {"PyTorch, loss upcast to fp32": lambda: ref.naive_linear_ce(x, w, t, upcast=True),
           "PyTorch, bf16": lambda: ref.naive_linear_ce(x, w, t),
           "reference": ours(),
           "reference, fp32 dW": ours(fp32_dw=True)}
    for d in BUDGETS:
        if d != 32:
            fns[f"reference, scratch (dX+dW)/{d}"] = ours(budget=grads // d)
    fns["filtered (section 8)"] = lambda: ref.filtered_linear_cross_entropy(x, w, t)
    fns["filtered, eps 0 (every block)"] = lambda: ref.filtered_linear_cross_entropy(x, w, t, filter_eps=0.0)
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss()
        fns["Liger Kernel"] = lambda: liger(w, x, t)
    except ImportError:
        pass
    try:
        from cut_cross_entropy import linear_cross_entropy
        fns["Cut Cross-Entropy"] = lambda: linear_cross_entropy(x, w, t, ignore_index=-100)
        fns["Cut Cross-Entropy, no filter"] = lambda: linear_cross_entropy(x, w, t, ignore_index=-100, filter_eps=None)
    except ImportError:
        pass
    return fns


class _Planned(torch.autograd.Function):
    """The reference with an explicit tile plan (for the budget sweep)."""
    @staticmethod
    def forward(ctx, ref, x, w, t, plan):
        loss, dx, dw, _ = ref.fused_linear_ce_forward(x, w, t, chunks=plan)
        ctx.save_for_backward(dx, dw)
        return loss

    @staticmethod
    def backward(ctx, g):
        dx, dw = ctx.saved_tensors
        return None, dx, dw, None, None


def _head(ref, name: str, n: int, h: int, v: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16, generator=gen) / h**0.5).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=gen)
    t[torch.rand(n, device="cuda", generator=gen) < 0.1] = -100
    grads = (n + v) * h * 2
    fns = _contenders(ref, x, w, t, grads)
    steps = {}
    for label, fn in fns.items():
        def step(fn=fn):
            x.grad = w.grad = None
            fn().backward()
        steps[label] = step
    results, reference = {}, None
    for label, step in steps.items():
        _, report = measure_peak(step)
        x.grad = w.grad = None
        loss = fns[label]()
        loss.backward()
        got = (loss.detach().float(), x.grad.float(), w.grad.float())
        reference = reference or got
        results[label] = dict(peak_bytes=report.peak_bytes + grads,
                              error=[round((a - b).abs().max().item(), 9) for a, b in zip(got, reference)])
        x.grad = w.grad = None
        del loss, got
    times = {label: [] for label in steps}
    for _ in range(3):
        for label, step in steps.items():
            times[label].append(median_ms(step, warmup_ms=100, rep_ms=500))
    rows = []
    kept, profiles = _kept_share(ref, x, w, t), {label: kernel_ms(step, CUBLAS) for label, step in steps.items()}
    for label in steps:
        ms = statistics.median(times[label])
        rows.append(dict(head=name, tokens=n, hidden=h, vocab=v, contender=label, ms=round(ms, 2),
                         peak_mib=round(results[label]["peak_bytes"] / 2**20, 1),
                         grads_mib=round(grads / 2**20, 1), error=results[label]["error"], kept=kept,
                         device_ms=round(sum(profiles[label].values()), 2), kernels_ms=profiles[label]))
        print(rows[-1], flush=True)
    del x, w, t
    torch.cuda.empty_cache()
    return rows


def _kept_share(ref, x, w, t, tokens: int = 1024) -> float:
    """The share of BLOCK_M x BLOCK_N blocks of the gradient with an entry >= ref.FILTER_EPS, on whole rows."""
    from memfit.hardware import config
    blocks = config("ce_blocks")
    bm, bn = blocks["BLOCK_M"], blocks["BLOCK_N"]
    with torch.no_grad():
        _, g = ref.cross_entropy_with_grad(F.linear(x[:tokens], w), t[:tokens], reduction="sum")
        g = F.pad(g.abs(), (0, -g.shape[1] % bn, 0, -g.shape[0] % bm))
        big = g.view(g.shape[0] // bm, bm, g.shape[1] // bn, bn).amax(dim=(1, 3)) >= ref.FILTER_EPS
    return round(big.float().mean().item(), 4)


def run() -> dict:
    import memfit.from_lessons.fused_linear_ce as ref
    rows = [row for name, (n, h, v) in HEADS.items() for row in _head(ref, name, n, h, v)]
    return dict(title="Lesson 06: fused linear cross-entropy against PyTorch's chain, Liger Kernel and Cut "
                      "Cross-Entropy", rows=rows)


def markdown(result: dict) -> str:
    lines = [f"### {result['title']}", "",
             "bf16, 8,192 tokens, 10% ignored, loss + backward. Memory: peak during the call, gradients included "
             "(bar: 1.05 x (dX + dW)). Time: median of 3 interleaved do_bench medians, as called (the host's launches "
             "included); device ms: the sum of the kernels' times in one call (torch.profiler), what the GPU spends "
             "whatever the host. Error: max |difference| of loss, dX, dW from PyTorch's chain with the loss upcast to "
             "fp32.", ""]
    for head in dict.fromkeys(r["head"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["head"] == head]
        base = next(r for r in rows if r["contender"].startswith("PyTorch, loss upcast"))
        r0 = rows[0]
        lines += [f"**{head}** head: {r0['tokens']} x {r0['hidden']} -> {r0['vocab']}; dX + dW = "
                  f"{r0['grads_mib']:,.0f} MiB, bar {1.05 * r0['grads_mib']:,.0f} MiB", "",
                  "| contender | peak MiB | / (dX + dW) | ms | / PyTorch upcast | / CCE | device ms | / CCE | "
                  "error loss, dX, dW |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        cce = next((r for r in rows if r["contender"] == "Cut Cross-Entropy"), None)

        def vs_cce(r, key):
            return "-" if cce is None else f"{r[key] / cce[key]:.2f}x"
        lines += [f"| {r['contender']} | {r['peak_mib']:,.0f} | {r['peak_mib'] / r['grads_mib']:.3f} | {r['ms']:.1f} | "
                  f"{r['ms'] / base['ms']:.2f}x | {vs_cce(r, 'ms')} | {r['device_ms']:.1f} | "
                  f"{vs_cce(r, 'device_ms')} | "
                  f"{', '.join(f'{e:.1e}' for e in r['error'])} |" for r in rows]
        lines += ["", f"Blocks the filter keeps: {r0['kept']:.1%} (blocks of the ce_blocks config, counted on "
                      "the first 1,024 tokens' whole rows). Device time by kernel, one loss + backward "
                      "(torch.profiler):", ""]
        for r in rows:
            if r["contender"] in ("reference", "filtered (section 8)", "Cut Cross-Entropy"):
                total = sum(r["kernels_ms"].values())
                top = ", ".join(f"{k} {v:.1f}" for k, v in list(r["kernels_ms"].items())[:6])
                lines.append(f"* {r['contender']}: {total:.1f} ms in kernels: {top}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # this lesson alone: python -m benchmarks.fused_linear_ce
    from benchmarks.record import record_one
    record_one("fused_linear_ce", note="the reference, PyTorch's chain, Liger Kernel 0.8.5 and Cut Cross-Entropy "
                                       "25.1.1 measured in this one run")
