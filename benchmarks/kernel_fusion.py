"""Lesson 04 benchmark: the reference fused kernels (solutions/04_kernel_fusion.ipynb, extracted to
memfit.from_lessons.kernel_fusion) against eager PyTorch and torch.compile, in one run on one GPU.

* b = a**4 on 1 GiB of fp32: bandwidth counted as the fused minimum (read a, write b) against a device copy of
  the same tensor (read + write), the ceiling.
* RMSNorm and SwiGLU, forward + backward, bf16, 8192 tokens, on Llama-like widths (hidden 4096 and 8192; SwiGLU
  on Llama-3's 14336 and 28672): the reference autograd Functions against torch.compile of the eager formula
  (memfit.gpt's; for SwiGLU the split of w13's output included) and against eager. Medians of
  triton.testing.do_bench over whole forward + backward passes (gradients reset each time).
"""
from __future__ import annotations

import torch

from memfit.gpt import rms_norm, swiglu
from memfit.timing import median_ms

TOKENS = 8192
WIDTHS = [(4096, 14336), (8192, 28672)]  # (hidden, SwiGLU width) of Llama-3 8B and 70B


def _rmsnorm_eager(x, w):
    return rms_norm(x, w, 1e-5)


def _swiglu_eager(gate_up):
    return swiglu(*gate_up.chunk(2, dim=-1))  # the split inside, so torch.compile sees (and fuses) it too


def _fwd_bwd(fn, inputs, grad):
    def run():
        for t in inputs:
            t.grad = None
        fn(*inputs).backward(grad)
    return run


def run() -> dict:
    import memfit.from_lessons.kernel_fusion as ref
    torch.manual_seed(0)
    n = (1 << 30) // 4
    a = torch.randn(n, device="cuda")
    dst = torch.empty_like(a)
    copy_ms = median_ms(lambda: dst.copy_(a))
    useful = 2 * a.nbytes
    compiled_pow4 = torch.compile(lambda t: t * t * t * t)
    pow4 = {"copy (ceiling)": copy_ms, "eager": median_ms(lambda: a * a * a * a),
            "torch.compile": median_ms(lambda: compiled_pow4(a)), "reference Triton": median_ms(lambda: ref.pow4(a, out=dst))}
    pow4_rows = [dict(impl=k, ms=round(v, 4), tb_s=round(useful / v / 1e9, 3), of_copy=round(copy_ms / v, 3))
                 for k, v in pow4.items()]
    del a, dst
    kernels, sweep = [], {}
    compiled_norm = torch.compile(_rmsnorm_eager)
    compiled_swiglu = torch.compile(_swiglu_eager)
    for hidden, ffn in WIDTHS:
        x = torch.randn(TOKENS, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5).requires_grad_(True)
        dy = torch.randn_like(x)
        impls = {"eager": _rmsnorm_eager, "torch.compile": compiled_norm,
                 "reference Triton": lambda x, w: ref.RMSNormFunction.apply(x, w, 1e-5)}
        times = {k: median_ms(_fwd_bwd(f, (x, w), dy), warmup_ms=200, rep_ms=2000) for k, f in impls.items()}
        kernels.append(dict(kernel="RMSNorm fwd+bwd", shape=f"{TOKENS} x {hidden}", **{k: round(v, 4) for k, v in times.items()},
                            speedup_vs_compile=round(times["torch.compile"] / times["reference Triton"], 3)))
        sweep[hidden] = _programs_sweep(ref, x, w, dy)
        del x, w, dy
        gate_up = torch.randn(TOKENS, 2 * ffn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dh = torch.randn(TOKENS, ffn, device="cuda", dtype=torch.bfloat16)
        impls = {"eager": _swiglu_eager, "torch.compile": compiled_swiglu, "reference Triton": ref.SwiGLUFunction.apply}
        times = {k: median_ms(_fwd_bwd(f, (gate_up,), dh), warmup_ms=200, rep_ms=2000) for k, f in impls.items()}
        kernels.append(dict(kernel="SwiGLU fwd+bwd", shape=f"{TOKENS} x {ffn}", **{k: round(v, 4) for k, v in times.items()},
                            speedup_vs_compile=round(times["torch.compile"] / times["reference Triton"], 3)))
        del gate_up, dh
        torch.cuda.empty_cache()
    return dict(title="Lesson 04: fused kernels against eager PyTorch and torch.compile", pow4=pow4_rows, kernels=kernels,
                rmsnorm_backward_programs=sweep)


def _programs_sweep(ref, x, w, dy) -> dict:
    """rmsnorm_backward alone with 1, 2, 4 and 8 programs per SM (the reference picks 16 / num_warps)."""
    _, rstd = ref.rmsnorm_forward(x.detach(), w.detach())
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    chosen = ref._programs
    out = {}
    try:
        for per_sm in (1, 2, 4, 8):
            ref._programs = lambda device, num_warps, k=per_sm: sms * k
            out[per_sm] = round(median_ms(lambda: ref.rmsnorm_backward(dy, x.detach(), w.detach(), rstd),
                                          warmup_ms=100, rep_ms=500), 4)
    finally:
        ref._programs = chosen
    return out


def markdown(result: dict) -> str:
    lines = [f"### {result['title']}", "", "`b = a**4`, 1 GiB fp32; bandwidth = (read a + write b) / time:", "",
             "| version | ms | TB/s | of the copy's |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['impl']} | {r['ms']} | {r['tb_s']} | {r['of_copy']:.0%} |" for r in result["pow4"]]
    lines += ["", "Forward + backward, bf16, ms (lower is better):", "",
              "| kernel | tokens x width | eager | torch.compile | reference Triton | compile / ours |",
              "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {k['kernel']} | {k['shape']} | {k['eager']} | {k['torch.compile']} | {k['reference Triton']} | "
              f"{k['speedup_vs_compile']:.2f}x |" for k in result["kernels"]]
    lines += ["", "RMSNorm backward alone (ms) by programs per SM (the reference launches 16 / num_warps per SM: 2 at hidden 4096, 1 at 8192):", "",
              "| hidden | " + " | ".join(f"{k} per SM" for k in (1, 2, 4, 8)) + " |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {h} | " + " | ".join(str(v[k]) for k in v) + " |" for h, v in result["rmsnorm_backward_programs"].items()]
    return "\n".join(lines)


if __name__ == "__main__":  # this lesson alone: python -m benchmarks.kernel_fusion
    from benchmarks.record import record_one
    record_one("kernel_fusion", note="eager, torch.compile and ours measured in this one run")
