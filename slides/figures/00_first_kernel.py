"""Lesson 00's deck: the hardware profiles, counting bytes with the lesson's bytes_of, the masked launch,
the memory meter on the lesson's scaled_add, and the H100 bandwidth record."""
from __future__ import annotations

from types import SimpleNamespace

import torch

import memfit
from memfit.hardware import KNOWN_GPUS, KiB, config, profile_for
from slides.figures import (COLORS, canvas, dtype_name, figure, gb, gib, kib, lanes, lesson, limit,  # noqa: F401
                            markdown_table, measured_on, record, source)


ref = lesson("00_first_kernel")
embed = ref.bytes_of((128256, 4096), torch.bfloat16)
scaled_add = config("scaled_add", profile_for("t4"))
bench = record("first_kernel", file="h100")
table = bench["first_kernel"]
ours, eager = (next(r for r in table["rows"] if r["impl"].startswith(impl) and r["dtype"] == "float32")
               for impl in ("reference", "eager"))


def _measure() -> SimpleNamespace:
    """PyTorch's x + 0.5 * y against the lesson's scaled_add, on the course's memory meter, here and now."""
    n = memfit.size("first_kernel")["n_demo"]
    x, y = torch.randn(n, device=memfit.DEVICE), torch.randn(n, device=memfit.DEVICE)
    _, eager = memfit.measure_peak(lambda: x + 0.5 * y)
    _, fused = memfit.measure_peak(lambda: ref.scaled_add(x, y, 0.5))
    return SimpleNamespace(n=n, output=ref.bytes_of(x.shape, x.dtype), eager=eager.peak_bytes, fused=fused.peak_bytes)


meter = _measure()


def profiles_table() -> str:
    rows = [["`cpu`", "a laptop", "—", "—", "fp32, fp16", "interpreter, live-tensor meter"]]
    for name, spec in KNOWN_GPUS.items():
        rows.append([f"`{name}`", spec["gpu_name"], f"sm_{spec['capability'][0]}{spec['capability'][1]}",
                     f"{spec['shared_memory_per_block'] // KiB} KiB",
                     ", ".join(dtype_name(d) for d in profile_for(name).dtypes), "compiled, CUDA allocator"])
    return markdown_table(["profile", "card", "arch", "shared mem / block", "dtypes", "kernels, memory"], rows)


def bench_table() -> str:
    return markdown_table(["implementation", "dtype", "ms", "TB/s", "of copy", "peak extra MiB"],
                          [[r["impl"], dtype_name(r["dtype"]), f"{r['ms']:.3f}", f"{r['tbps']:.2f}",
                            f"{r['of_copy_ceiling']:.0%}", f"{r['peak_extra_mib']:,.0f}"] for r in table["rows"]])


def fig_masked_blocks():
    """n = 17 elements with BLOCK = 8: three programs, the last one masked past n."""
    n, block = 17, 8
    programs = -(-n // block)
    fig, ax = canvas(figsize=(10, 2.6))
    colors = [COLORS["params"], COLORS["grads"], COLORS["optimizer"]]
    lanes(ax, [colors[i // block] for i in range(programs * block)], n, fontsize=11)
    for p in range(programs):
        ax.annotate(f"program {p}: offsets {p * block}…{p * block + block - 1}", (p * block + block / 2, 1.15),
                    ha="center", fontsize=13)
    ax.annotate(f"mask = offsets < n  (n = {n}): {programs * block - n} lanes off",
                (n + (programs * block - n) / 2, -0.45), ha="center", fontsize=13, color=COLORS["activations"])
    ax.set(xlim=(-0.3, programs * block + 0.3), ylim=(-0.8, 1.6))
    return fig


def fig_bandwidth():
    """The recorded H100 run: TB/s of each implementation against the measured copy ceiling."""
    rows = [r for r in table["rows"] if r["dtype"] == "float32"]
    fig, ax = figure(figsize=(8.5, 4.0))
    names = [r["impl"].replace(" (Triton)", "\n(Triton)").replace("eager ", "eager\n") for r in rows]
    colors = [COLORS["ours"] if r["impl"].startswith("reference") else COLORS["peer"] for r in rows]
    ax.barh(names, [r["tbps"] for r in rows], color=colors)
    limit(ax, table["copy_ceiling_tbps"], " copy ceiling", (table["copy_ceiling_tbps"], len(rows) - 0.4), va="center")
    ax.invert_yaxis()
    ax.set(xlabel="TB/s moved (read x, read y, write out), fp32, 1 GiB per tensor", title=bench["device"])
    return fig
