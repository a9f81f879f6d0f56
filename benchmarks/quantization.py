"""Lesson 07 benchmark: the reference weight-only int8 matmul (solutions/07_quantization.ipynb, extracted to
memfit.from_lessons.quantization) against dequantize-then-matmul and PyTorch's fp16 matmul (cuBLAS); the Q8_0 and
Q4_0 kernels' bandwidth; AdamW8bit against torch.optim.AdamW on the course's small GPT, in one run on one GPU.

Matmul: y = x Wᵀ with x of M x K in fp16 and W of Llama-3-8B's shapes (N x K: attention 4096 x 4096, MLP up
14336 x 4096, MLP down 4096 x 14336) in Q8_0, M from 1 token (decoding) to 4,096; the fused kernel alone and
int8_linear (the fused kernel for few rows, dequantized slices + cuBLAS for many). Time: the device's, one call
under a CUDA graph with L2 emptied before it (memfit.timing.graph_device_ms), and as called from Python (the median
of three interleaved triton.testing.do_bench medians), with the host's microseconds per call. Memory: the CUDA
allocator's peak during the call above what was allocated before (memfit.measure_peak), W and x excluded. Weight GB/s: the bytes of W as each contender reads it
(fp16: 2 per weight; Q8_0: 34 per 32) over the time.

    python -m benchmarks.quantization            # the record
    python -m benchmarks.quantization --matmul   # the matmul table alone (suffix -matmul)
    python -m benchmarks.quantization --sweep    # the tile sweep behind memfit.hardware's "int8_matmul" rows
"""
from __future__ import annotations

import statistics
import sys

import torch

from memfit.meter import measure_peak
from memfit.timing import graph_device_ms, host_us_per_call, median_ms

SHAPES = {"attention (q, o)": (4096, 4096), "MLP up/gate": (14336, 4096), "MLP down": (4096, 14336)}
TOKENS = (1, 16, 64, 256, 1024, 4096)


def _weight(n: int, k: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    return torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) * 0.02


MATMULS = ("fp16 matmul (cuBLAS)", "dequantize, then matmul", "fused int8 matmul", "int8_linear")


def _matmul_rows(ref) -> list[dict]:
    rows = []
    for shape_name, (n, k) in SHAPES.items():
        w = _weight(n, k)
        qw = ref.quantize_q8_0(w)
        w_hat = ref.dequantize_q8_0(qw)
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.5
            fns = dict(zip(MATMULS, (lambda: x @ w.T, lambda: x @ ref.dequantize_q8_0(qw).T,
                                     lambda: ref.int8_weight_matmul(x, qw), lambda: ref.int8_linear(x, qw))))
            exact = (x.double() @ w_hat.double().T)
            peaks, errors = {}, {}
            for label, fn in fns.items():
                out, report = measure_peak(fn)
                peaks[label] = report.peak_bytes
                errors[label] = (out.double() - exact).abs().max().item()
            device = {label: graph_device_ms(fn) for label, fn in fns.items()}
            called = {label: [] for label in fns}
            for _ in range(3):
                for label, fn in fns.items():
                    called[label].append(median_ms(fn, warmup_ms=25, rep_ms=100))
            for label, fn in fns.items():
                ms = device[label]
                weight_bytes = qw.nbytes if label == "fused int8 matmul" else n * k * 2
                rows.append(dict(shape=shape_name, n=n, k=k, m=m, contender=label, us=round(ms * 1e3, 1),
                                 called_us=round(statistics.median(called[label]) * 1e3, 1),
                                 host_us=round(host_us_per_call(fn), 1), weight_gbs=round(weight_bytes / ms / 1e6, 1),
                                 tflops=round(2 * m * n * k / ms / 1e9, 1), peak_mib=round(peaks[label] / 2**20, 2),
                                 error_vs_dequantized=errors[label]))
                print(rows[-1], flush=True)
        del w, qw, w_hat
        torch.cuda.empty_cache()
    return rows


def _format_rows(ref) -> list[dict]:
    """Quantize and dequantize a 14336 x 4096 fp16 weight: bytes read + written per second."""
    w = _weight(14336, 4096)
    rows = []
    for fmt, quantize, dequantize in (("Q8_0", ref.quantize_q8_0, ref.dequantize_q8_0),
                                      ("Q4_0", ref.quantize_q4_0, ref.dequantize_q4_0)):
        qt = quantize(w)
        moved = w.numel() * 2 + qt.nbytes
        for op, fn in (("quantize", lambda: quantize(w)), ("dequantize", lambda: dequantize(qt))):
            ms = median_ms(fn, warmup_ms=25, rep_ms=200)
            rows.append(dict(format=fmt, op=op, us=round(ms * 1e3, 1), gbs=round(moved / ms / 1e6, 1),
                             relative_error=round(((dequantize(qt).float() - w.float()).norm() / w.float().norm()).item(), 5)))
            print(rows[-1], flush=True)
    copy_ms = median_ms(lambda: w.clone(), warmup_ms=25, rep_ms=200)
    rows.append(dict(format="fp16", op="copy (clone)", us=round(copy_ms * 1e3, 1),
                     gbs=round(2 * w.numel() * 2 / copy_ms / 1e6, 1), relative_error=0.0))
    return rows


def _optimizer_rows(ref) -> list[dict]:
    """The course's small GPT in mixed precision (amp) with each optimizer: states, the step's peak, step time
    (the optimizer step: do_bench's median of the step alone, on gradients that stay)."""
    from memfit.gpt import COURSE_CONFIGS, unique_parameters
    cfg = COURSE_CONFIGS["small"]
    contenders = {"torch.optim.AdamW (foreach)": lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.1, foreach=True),
                  "torch.optim.AdamW (fused)": lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.1, fused=True),
                  "AdamW8bit (PyTorch, exercise 5)": lambda p: ref.AdamW8bit(p, lr=3e-4, weight_decay=0.1),
                  "FusedAdamW8bit (Triton)": lambda p: ref.FusedAdamW8bit(p, lr=3e-4, weight_decay=0.1)}
    try:  # a peer, where its wheel was carried to the GPU machine (pure Python on torch; its step is torch.compiled)
        import torchao
        from torchao.optim import AdamW8bit as TorchaoAdamW8bit
        contenders[f"torchao {torchao.__version__} AdamW8bit"] = lambda p: TorchaoAdamW8bit(p, lr=3e-4, weight_decay=0.1)
    except Exception as exc:  # noqa: BLE001  (absent, or built for another torch)
        print(f"torchao's AdamW8bit not timed: {type(exc).__name__}: {exc}", flush=True)
    trainers = {}
    for label, make in contenders.items():
        try:  # a peer that fails here is reported, not fatal
            trainers[label] = _measured_trainer(cfg, make)
        except Exception as exc:  # noqa: BLE001
            print(f"{label} not timed: {type(exc).__name__}: {exc}", flush=True)
    # the training steps of course-small are short and bound by the host, whose speed drifts by +-20% from one
    # second to the next (measured on the H100 machine): medians of five interleaved rounds
    times = {label: [] for label in trainers}
    for _ in range(5):
        for label, (trainer, _, batch) in trainers.items():
            times[label].append(median_ms(lambda: trainer.step(*batch), warmup_ms=100, rep_ms=500))
    rows = []
    for label, (trainer, step, _) in trainers.items():
        n = sum(p.numel() for p in unique_parameters(trainer.model))
        for p in trainer.model.parameters():  # the optimizer step alone, on gradients that stay
            p.grad = torch.randn_like(p)
        opt_ms = median_ms(trainer.optimizer.step, warmup_ms=50, rep_ms=500)
        rows.append(dict(optimizer=label, params=n, state_bytes_per_param=round(step.states["optimizer"] / n, 3),
                         model_state_bytes_per_param=round((step.states["params"] + step.states["optimizer"]) / n + 4, 3),
                         step_peak_mib=round(step.peak / 2**20, 1), train_step_ms=round(statistics.median(times[label]), 2),
                         optimizer_step_ms=round(opt_ms, 3)))
        print(rows[-1], flush=True)
    return rows


def _measured_trainer(cfg, make):
    """A trainer of `cfg` in amp with the optimizer `make` builds, its measured step (states and peak), a batch."""
    from memfit.training import Trainer, measure_step, random_batch
    trainer = Trainer(cfg, precision="amp", optimizer=make)
    step = measure_step(trainer, 4, 1024)
    return trainer, step, random_batch(cfg, 4, 1024, trainer.device)


def run() -> dict:
    import memfit.from_lessons.quantization as ref
    return dict(title="Lesson 07: the weight-only int8 matmul, Q8_0/Q4_0 kernels and AdamW8bit",
                matmul=_matmul_rows(ref), formats=_format_rows(ref), optimizers=_optimizer_rows(ref))


def markdown(result: dict) -> str:
    lines = [f"### {result['title']}", "",
             "**y = x Wᵀ**, x fp16 (M x K), W in Q8_0 (Llama-3-8B shapes). Device µs: one call's time under a CUDA "
             "graph, L2 emptied before each call (memfit.timing.graph_device_ms): what a server that captures its "
             "forward in graphs waits. As called: the median of 3 interleaved do_bench medians of the plain Python "
             "call, the host's time included where the host is the slower side. Host µs: Python's time per call "
             "(from 1,024 rows on the device is slower, the launch queue fills, and this counts its time too). "
             "int8_linear: the fused kernel below the \"int8_prefill\" row's min_rows, dequantized slices + "
             "cuBLAS from there on. Peak: what the call allocates.", "",
             "| W (N x K) | M | fp16 matmul µs | dequantize + matmul µs | fused int8 µs | int8_linear µs | fused / fp16 "
             "| int8_linear / fp16 | as called: fp16 / int8_linear µs | host µs: fp16 / int8_linear | "
             "peak MiB fp16 / deq+mm / fused / int8_linear |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = result["matmul"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for m in dict.fromkeys(r["m"] for r in rows if r["shape"] == shape):
            by = {r["contender"]: r for r in rows if r["shape"] == shape and r["m"] == m}
            f, d, q, lin = (by[c] for c in MATMULS)
            lines.append(f"| {shape} ({f['n']} x {f['k']}) | {m} | {f['us']:.1f} | {d['us']:.1f} | {q['us']:.1f} | "
                         f"{lin['us']:.1f} | {q['us'] / f['us']:.2f}x | **{lin['us'] / f['us']:.2f}x** | "
                         f"{f['called_us']:.1f} / {lin['called_us']:.1f} | {f['host_us']:.1f} / {lin['host_us']:.1f} | "
                         f"{f['peak_mib']:.2f} / {d['peak_mib']:.1f} / {q['peak_mib']:.2f} / {lin['peak_mib']:.2f} |")
    if result["formats"]:
        lines += ["", "**Block formats**, a 14336 x 4096 fp16 weight (GB/s: fp16 bytes + quantized bytes over the "
                  "time; the copy: a clone's read + write)", "", "| format | op | µs | GB/s | relative error |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['format']} | {r['op']} | {r['us']:.1f} | {r['gbs']:,.0f} | {r['relative_error']:.2%} |"
                  for r in result["formats"]]
    if result["optimizers"]:
        lines += ["", "**Optimizers**, course-small GPT in amp (fp32 weights and gradients), batch 4 x 1024",
                  "", "| optimizer | params | state B/param | weights + grads + states B/param | step peak MiB | "
                  "train step ms (median of 5 interleaved) | optimizer step ms |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['optimizer']} | {r['params']:,} | {r['state_bytes_per_param']:.3f} | "
                  f"{r['model_state_bytes_per_param']:.2f} | {r['step_peak_mib']:,.1f} | {r['train_step_ms']:.1f} | "
                  f"{r['optimizer_step_ms']:.3f} |" for r in result["optimizers"]]
    if any(r["optimizer"].startswith("torchao") for r in result["optimizers"]):
        lines += ["", "torchao keeps its 8-bit states in tensor subclasses, which the trainer's count of state bytes "
                  "takes at their logical fp32 size: its B/param and peak columns are not its real footprint."]
    return "\n".join(lines) + "\n"


def _sweep_configs(variant: str) -> list[dict]:
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
    rows = {"m16": [(16, 64, 128, s, 4, 3) for s in (2, 4, 8)] + [(16, 32, 256, 4, 4, 3), (16, 128, 128, 4, 8, 3)],
            "m64": [(64, 64, 128, 4, 4, 3), (64, 64, 128, 2, 4, 3), (32, 128, 128, 4, 8, 4), (64, 64, 64, 4, 8, 3),
                    (64, 128, 64, 1, 4, 4), (64, 64, 128, 1, 4, 4)],
            "m256": [(128, 128, 64, 1, 8, 3), (128, 128, 64, 2, 8, 3), (64, 128, 128, 2, 4, 4),
                     (128, 256, 64, 1, 8, 3), (256, 128, 64, 1, 8, 3), (128, 128, 64, 1, 4, 4)],
            "m_large": [(128, 256, 64, 1, 8, 3), (256, 128, 64, 1, 8, 3), (128, 128, 64, 1, 8, 4),
                        (128, 128, 128, 1, 8, 3), (256, 128, 64, 1, 8, 4), (128, 128, 64, 1, 4, 4)]}
    return [dict(zip(keys, r)) for r in rows[variant]]


def sweep() -> None:
    """Time tile configs of the reference int8_weight_matmul at every shape and M (fp16), print the best three per
    (shape, M): the rows of memfit.hardware's "int8_matmul" table for this card are picked from it."""
    import memfit.from_lessons.quantization as ref
    from memfit.hardware import KERNEL_CONFIGS, profile
    table = KERNEL_CONFIGS["int8_matmul"]
    row = profile().name if profile().name in table else "gpu"
    saved = {variant: dict(cfg) for variant, cfg in table[row].items()}
    try:
        for shape_name, (n, k) in SHAPES.items():
            qw = ref.quantize_q8_0(_weight(n, k))
            for m in TOKENS:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                variant = ref.int8_matmul_variant(m)
                deq_mm = median_ms(lambda: x @ ref.dequantize_q8_0(qw).T)
                results = []
                for cfg in _sweep_configs(variant):
                    table[row][variant] = cfg
                    try:
                        results.append((median_ms(lambda: ref.int8_weight_matmul(x, qw)), cfg))
                    except Exception as exc:  # noqa: BLE001  (a config that does not fit: skip it)
                        print("skip", cfg, type(exc).__name__)
                results.sort(key=lambda r: r[0])
                print(f"{shape_name} M={m} ({variant}): deq+mm {deq_mm * 1e3:.1f} µs; best " +
                      "; ".join(f"{ms * 1e3:.1f} µs {c}" for ms, c in results[:3]), flush=True)
    finally:
        table[row].update(saved)


def run_matmul() -> dict:
    """The matmul table alone (--matmul): recorded with the suffix "matmul"."""
    import memfit.from_lessons.quantization as ref
    return dict(title="Lesson 07: the weight-only int8 matmul and int8_linear", matmul=_matmul_rows(ref), formats=[],
                optimizers=[])


if __name__ == "__main__":
    if "--sweep" in sys.argv:
        sweep()
    else:
        from benchmarks.record import record_one
        if "--matmul" in sys.argv:
            record_one("quantization", run=run_matmul, part="matmul")
        else:
            record_one("quantization")
