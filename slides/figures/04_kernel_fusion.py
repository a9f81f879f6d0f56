"""Lesson 04's deck: the three regimes and the roofline from the notebook's recorded H100 run, the traffic of eager
PyTorch traced op by op (a**4, memfit.gpt's RMSNorm and SwiGLU) against the fused minimum, the lesson's launch
rules at Llama widths, the memory meter on the lesson's pow4, the activation bytes fusion saves (the lesson's
fusion_savings_per_layer, checked against autograd's saved tensors on course-tiny) and the make bench record."""
from __future__ import annotations

import functools
from math import floor, log10

import memfit  # before triton: on a machine without a GPU, memfit switches triton to its interpreter

import matplotlib.patches as patches  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from autograder.checks.kernel_fusion import CHECKS, measured_savings
from memfit.from_lessons.activations import activation_bytes
from memfit.gpt import COURSE_CONFIGS, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B, rms_norm, swiglu
from memfit.hardware import KNOWN_GPUS, KiB, config  # noqa: F401 (the deck)
from slides.figures import (COLORS, arrow, canvas, figure, gib, lesson, limit, log_record, markdown_table,  # noqa: F401
                            measured_on, record, source)

LESSON = "04_kernel_fusion"
MiB = 2**20
ref = lesson(LESSON)
bench = record("kernel_fusion")
kf = bench["kernel_fusion"]
# the notebook's own run on a GPU (the three regimes, the convergence demo, the compile check)
nb = log_record("lesson04_log")
pow4 = {r["impl"]: r for r in kf["pow4"]}
eager4, ours4, compiled4, copy4 = (pow4["eager"], pow4["reference Triton"], pow4["torch.compile"],
                                   pow4["copy (ceiling)"])
# the bandwidth roof: make bench's copy of 1 GiB (the ceiling its pow4 rows are measured against)
roof_bandwidth = copy4["tb_s"] * 1e12


# -------------------------------------------------------------------------------- traced traffic

class _Trace(TorchDispatchMode):
    """Every aten op a function runs (views and detaches left out: they move no bytes), with the bytes it reads
    (each distinct input once) and writes. Run on meta tensors: Llama-sized shapes, nothing allocated."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.__name__.startswith("detach"):
            return out
        reads = {}
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                key = (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
                reads[key] = min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
        writes = sum(t.numel() * t.element_size() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        self.ops.append((func.__name__.split(".")[0], sum(reads.values()), writes))
        return out

    @property
    def bytes(self) -> int:
        return sum(r + w for _, r, w in self.ops)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@functools.cache
def _rmsnorm_traffic(tokens: int, hidden: int) -> dict:
    """memfit.gpt.rms_norm (the formula the lesson fuses) on tokens x hidden in bf16, forward and backward traced,
    against the fused minimum: forward reads x, w and writes y, rstd; backward reads dy, x, w, rstd, writes dx, dw."""
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16, requires_grad=True, device="meta")
    w = torch.empty(hidden, dtype=torch.bfloat16, requires_grad=True, device="meta")
    with _Trace() as fwd:
        y = rms_norm(x, w, 1e-5)
    dy = torch.empty_like(y)  # outside the trace: the gradient arriving from above moves no bytes of the norm's
    with _Trace() as bwd:
        y.backward(dy)
    rstd = torch.empty(tokens, dtype=torch.float32, device="meta")
    return dict(eager_fwd=fwd, eager_bwd=bwd, unit=x.nbytes, shape=(tokens, hidden),
                fused_fwd=_nbytes(x, w) + _nbytes(y, rstd), fused_bwd=_nbytes(y, x, w, rstd) + _nbytes(x, w))


@functools.cache
def _swiglu_traffic(tokens: int, ffn: int) -> dict:
    """memfit.gpt.swiglu on the halves of w13's output [gate | up] (tokens x 2 ffn, bf16; the split inside, as in
    the benchmark), traced, against the fused minimum: forward reads [gate | up], writes h; backward reads dh and
    [gate | up], writes [dgate | dup]."""
    gate_up = torch.empty(tokens, 2 * ffn, dtype=torch.bfloat16, requires_grad=True, device="meta")
    with _Trace() as fwd:
        h = swiglu(*gate_up.chunk(2, dim=-1))
    dh = torch.empty_like(h)
    with _Trace() as bwd:
        h.backward(dh)
    return dict(eager_fwd=fwd, eager_bwd=bwd, unit=h.nbytes, shape=(tokens, ffn),
                fused_fwd=_nbytes(gate_up, h), fused_bwd=_nbytes(h, gate_up) + _nbytes(gate_up))


def _shape(row: dict) -> tuple[int, int]:
    tokens, width = (int(v) for v in row["shape"].split(" x "))
    return tokens, width


def _bench_shape(kernel: str) -> tuple[int, int]:
    """(tokens, width) of the first row of the recorded benchmark whose kernel starts with `kernel`."""
    return _shape(next(r for r in kf["kernels"] if r["kernel"].startswith(kernel)))


def _passes(n_bytes: int, unit: int) -> str:
    p = n_bytes / unit
    return f"{p:.0f}" if abs(p - round(p)) < 0.05 else f"{p:.1f}"


def _two_digits(x: float) -> str:
    """x to two significant digits, with thousands separators: 2165.3 -> '2,200'."""
    return f"{round(x, 1 - floor(log10(abs(x)))):,.0f}"


def _ridge() -> float:
    return nb["mm_flops"] / roof_bandwidth


# Eager PyTorch traced op by op against the fused minimum (each input read once, each output written once), at the
# recorded benchmark's sizes (a**4 on 1 GiB of fp32; its first RMSNorm and SwiGLU shapes, Llama-3-8B's).
_a = torch.empty((1 << 30) // 4, dtype=torch.float32, device="meta")
with _Trace() as _fwd:
    _a * _a * _a * _a
tokens, ffn = _bench_shape("SwiGLU")
p4 = dict(eager_fwd=_fwd, fused_fwd=_nbytes(_a, _a), unit=_a.nbytes)
rms, sw = _rmsnorm_traffic(*_bench_shape("RMSNorm")), _swiglu_traffic(tokens, ffn)
mm_bytes = torch.empty((), dtype=getattr(torch, nb["mm_dtype"])).element_size()
mm_intensity = 2 * nb["mm_n"] ** 3 / (3 * nb["mm_n"] ** 2 * mm_bytes)  # the lesson's n / (1.5 bytes)
tiny_op = 2 * nb["tiny_elements"] * 4  # the notebook's tiny op reads and writes that many fp32 values


def _meter() -> dict:
    """Eager a*a*a*a against the lesson's pow4 on the course's memory meter, here and now."""
    n = 1 << 16
    a = torch.randn(n, device=memfit.DEVICE)
    _, eager = memfit.measure_peak(lambda: a * a * a * a)
    _, fused = memfit.measure_peak(lambda: ref.pow4(a))
    return {"n": n, "output": a.nbytes, "eager": eager.peak_bytes, "fused": fused.peak_bytes}


def _savings() -> dict:
    """The lesson's fusion_savings_per_layer on course-tiny against the autograd-saved bytes the check measures,
    and at Llama-3.1-8B scale against the bytes a layer keeps (lesson 02's activation_bytes)."""
    tiny, batch, seq = COURSE_CONFIGS["tiny"], 2, 16
    big, (tokens, _) = LLAMA_3_1_8B, _bench_shape("RMSNorm")
    return {"tiny": tiny, "batch": batch, "seq": seq,
            "measured": measured_savings(tiny, batch, seq, torch.float32, ref.use_fused_kernels),
            "formula": ref.fusion_savings_per_layer(tiny, batch, seq, 4), "big": big, "tokens": tokens,
            "per_layer": ref.fusion_savings_per_layer(big, 1, tokens, 2),
            "kept": activation_bytes(big, 1, tokens, "bf16")}


meter = _meter()
sav = _savings()
mlp_saved = 2 * sav["tokens"] * sav["big"].ffn_hidden

# ------------------------------------------------------------------------------------------ tables

launch_rows = []  # the lesson's launch rules at the hidden sizes of the Llama family
for cfg in (LLAMA_3_2_1B, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B):
    block = triton.next_power_of_2(cfg.d_model)
    warps = ref._row_warps(block)
    launch_rows.append([cfg.name, f"{cfg.d_model:,}", f"{block:,}", str(warps), str(block // (32 * warps)),
                        str(max(1, 16 // warps))])
launch_table = markdown_table(["model", "hidden h", "BLOCK", "num_warps", "values / thread", "bwd programs / SM"],
                              launch_rows)

sweep = kf["rmsnorm_backward_programs"]
sweep_rows, verdict = [], []
for hidden, times in sweep.items():
    chosen = str(max(1, 16 // ref._row_warps(triton.next_power_of_2(int(hidden)))))
    best = min(times, key=times.get)
    sweep_rows.append([f"{int(hidden):,}"] + [f"**{v:.3f}**" if k == chosen else f"{v:.3f}"
                                              for k, v in times.items()])
    verdict.append(f"at hidden {int(hidden):,} the rule's choice is the fastest" if best == chosen else
                   f"at hidden {int(hidden):,}, {best} per SM beats the rule's {chosen} by "
                   f"{100 * (times[chosen] / times[best] - 1):.0f}%")
sweep_table = markdown_table(["hidden"] + [f"{k} per SM" for k in next(iter(sweep.values()))], sweep_rows)

# make bench's forward + backward times, with the fused minimum traffic over the recorded copy bandwidth
kernel_rows, share = [], {"RMSNorm": [], "SwiGLU": []}
for k in kf["kernels"]:
    tr = (_rmsnorm_traffic if k["kernel"].startswith("RMSNorm") else _swiglu_traffic)(*_shape(k))
    bound = (tr["fused_fwd"] + tr["fused_bwd"]) / roof_bandwidth * 1e3
    share[k["kernel"].split()[0]].append(100 * bound / k["reference Triton"])
    kernel_rows.append([k["kernel"].replace(" fwd+bwd", ""), k["shape"].replace(" x ", " × "), f"{k['eager']:.2f}",
                        f"{k['torch.compile']:.2f}", f"**{k['reference Triton']:.2f}**", f"{bound:.2f}",
                        f"{100 * bound / k['reference Triton']:.0f}%"])
kernels_table = markdown_table(["kernel", "tokens × width", "eager", "compile", "ours", "bound", "ours at"],
                               kernel_rows)


def _span(values: list[float]) -> str:
    lo, hi = f"{min(values):.0f}", f"{max(values):.0f}"
    return f"{lo}%" if lo == hi else f"{lo}–{hi}%"


# how close each kernel gets to its bound, where compile trails most
worst = max(kf["kernels"], key=lambda k: k["speedup_vs_compile"])
kern = {"sw_share": _span(share["SwiGLU"]), "rms_share": _span(share["RMSNorm"]),
        "compile_worst_shape": f"{worst['kernel'].split()[0]} {worst['shape'].replace(' x ', ' × ')}",
        "compile_worst_ratio": f"{worst['speedup_vs_compile']:.1f}"}
t4 = nb["compile_t4"]
what = {
    "pow4_numerics": "lengths off the block size, fp32/fp16 (+bf16 on GPUs), `out=` inside a NaN-poisoned buffer",
    "pow4_memory": "peak ≤ the output + 5%; no PyTorch arithmetic",
    "rmsnorm_forward": "y and fp32 `rstd` vs fp64; any leading dims; peak ≤ y + rstd + 5%",
    "rmsnorm_backward": "dx and dw (summed over all rows) vs autograd in fp64",
    "swiglu": "gate, up as strided halves of one tensor; dgate and dup in one tensor; peak ≤ it + 5%",
    "fused_gpt": "course-tiny: every gradient within 1e-4, loss curves within 0.1%",
    "fusion_savings": "your bytes = autograd's saved tensors, eager − fused, exactly",
}
check_table = markdown_table(["check", "points", "what it tests"],
                             [[f"`{c.name}`", f"{c.points:g}", what[c.name]] for c in CHECKS])


# ---------------------------------------------------------------------------------------- figures

def _box(ax, x, y, w, h, text, color, fontsize=14, text_color="white", alpha=0.9, **kw):
    ax.add_patch(patches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                        facecolor=color, edgecolor=color, alpha=alpha, **kw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def fig_pipeline():
    """Where an op's time goes: CPU launch -> HBM -> on-chip SRAM/registers -> compute, each a bottleneck,
    with the notebook's measured H100 numbers."""
    fig, ax = canvas(figsize=(13, 3.3))
    stages = [("CPU: Python,\ndispatcher", COLORS["neutral"]), ("HBM\n(GPU DRAM)", COLORS["params"]),
              ("SRAM,\nregisters", COLORS["optimizer"]), ("compute\nunits", COLORS["grads"])]
    w, gap = 2.75, 1.75
    for i, (name, color) in enumerate(stages):
        _box(ax, i * (w + gap), 1.0, w, 1.3, name, color, fontsize=17)
    labels = [("overhead", f"{nb['overhead_us']:.1f} µs a launch"),
              ("bandwidth", f"copy {nb['copy_bps'] / 1e12:.2f} TB/s"),
              ("compute", f"≈ {nb['mm_flops'] / 1e12:,.0f} TFLOP/s")]
    for i, (regime, number) in enumerate(labels):
        x0 = i * (w + gap) + w
        arrow(ax, (x0 + 0.05, 1.65), (x0 + gap - 0.05, 1.65), lw=3)
        ax.text(x0 + gap / 2, 2.6, regime, ha="center", fontsize=18, color=COLORS["activations"], fontweight="bold")
        ax.text(x0 + gap / 2, 0.45, number, ha="center", fontsize=16, color="#333")
    ax.set(xlim=(-0.1, 4 * w + 3 * gap + 0.1), ylim=(0.25, 3.0))
    return fig


def fig_roofline():
    """The H100 roofline from measured ceilings, and the lesson's kernels on it."""
    bw, peak = roof_bandwidth, nb["mm_flops"]
    fig, ax = figure(figsize=(7.4, 5.4))
    intensity = np.logspace(-2, 4, 300)
    ax.loglog(intensity, np.minimum(peak, intensity * bw), color="#222", lw=2.5)
    ridge = peak / bw
    ax.axvline(ridge, color=COLORS["neutral"], ls=":", lw=1.5)
    ax.text(ridge * 1.15, peak * 0.012, f"ridge ≈ {ridge:,.0f}\nFLOP/byte", fontsize=13, color="#555")
    # measured points (filled): x*x (notebook), a**4 eager and fused (make bench), the matmul ceiling
    n_elems = ours4["tb_s"] * 1e12 * ours4["ms"] / 1e3 / 8
    eager_flops_per_elem = len(p4["eager_fwd"].ops)  # one multiply per traced kernel
    eager_bytes_per_elem = p4["eager_fwd"].bytes / (p4["unit"] / 4)
    measured = [
        ("x*x", 1 / 8, nb["square_bps"] / 8, (10, -16)),
        ("a⁴ eager", eager_flops_per_elem / eager_bytes_per_elem,
         eager_flops_per_elem * n_elems / (eager4["ms"] / 1e3), (-92, 6)),
        ("a⁴ fused", 2 / 8, 2 * n_elems / (ours4["ms"] / 1e3), (10, -16)),
        (f"matmul {nb['mm_n']}", nb["mm_n"] / 3, peak, (-60, -28)),
    ]
    for name, i, f, offset in measured:
        ax.loglog(i, f, "o", ms=10, color=COLORS["ours"] if "fused" in name else COLORS["params"])
        ax.annotate(name, (i, f), textcoords="offset points", xytext=offset, fontsize=14)
    # bounds (hollow): what RMSNorm (≈ 1 FLOP/byte in bf16) and a 1024 matmul could reach at most
    for name, i, offset in (("RMSNorm", 4 / 4, (10, -16)), ("matmul 1024", 1024 / 3, (-95, 12))):
        ax.loglog(i, min(peak, i * bw), "o", ms=10, mfc="white", mec=COLORS["activations"], mew=2)
        ax.annotate(name + " (bound)", (i, min(peak, i * bw)), textcoords="offset points", xytext=offset, fontsize=14,
                    color=COLORS["activations"])
    ax.set(xlabel="arithmetic intensity I (FLOP/byte)", ylabel="FLOP/s", xlim=(1e-2, 1e4), ylim=(1e11, peak * 8))
    return fig


def fig_pow4_traffic():
    """Eager a*a*a*a: three kernels, each a round trip through HBM; fused: one kernel, one read, one write.
    Reads and writes per kernel from the trace."""
    ops, unit = p4["eager_fwd"].ops, p4["unit"]
    fig, ax = canvas(figsize=(12, 4.6))
    hbm_y, k_y, kh, kw = 0.0, 1.3, 0.9, 2.3

    def hbm(x0, x1, label):
        ax.add_patch(patches.Rectangle((x0, hbm_y), x1 - x0, 0.55, facecolor=COLORS["params"], alpha=0.25,
                                       edgecolor=COLORS["params"]))
        ax.text(x0 + 0.1, hbm_y + 0.27, label, va="center", fontsize=13, color=COLORS["params"])

    def arrows(x, reads, writes):
        for j in range(reads):
            xx = x + 0.45 + 0.3 * j
            arrow(ax, (xx, hbm_y + 0.57), (xx, k_y - 0.02), lw=2.2, color=COLORS["optimizer"])
        xx = x + kw - 0.45
        for j in range(writes):
            arrow(ax, (xx - 0.3 * j, k_y - 0.02), (xx - 0.3 * j, hbm_y + 0.57), lw=2.2, color=COLORS["activations"])

    hbm(-0.2, 8.7, "HBM")
    for i, ((op, r, w), name) in enumerate(zip(ops, ["t1 = a·a", "t2 = t1·a", "b = t2·a"])):
        _box(ax, i * 2.9, k_y, kw, kh, f"kernel {i + 1}\n{name}", COLORS["neutral"], fontsize=14)
        arrows(i * 2.9, round(r / unit), round(w / unit))
    ax.text(4.25, 2.55, f"eager: {len(ops)} kernels, {_passes(p4['eager_fwd'].bytes, unit)} passes over memory, "
            "2 temporaries", ha="center", fontsize=15, fontweight="bold")
    hbm(9.5, 12.6, "HBM")
    _box(ax, 9.9, k_y, kw, kh, "pow4\n(a·a)² in registers", COLORS["ours"], fontsize=14)
    arrows(9.9, 1, 1)
    ax.text(11.05, 2.55, f"fused: 1 kernel, {_passes(p4['fused_fwd'], unit)} passes", ha="center", fontsize=15,
            fontweight="bold", color=COLORS["ours"])
    ax.text(0.37, 0.9, "read", fontsize=14, ha="right", color=COLORS["optimizer"])
    ax.text(1.93, 0.9, "write", fontsize=14, ha="left", color=COLORS["activations"])
    ax.set(xlim=(-0.3, 12.7), ylim=(-0.2, 2.9))
    return fig


def fig_pow4_bench():
    """make bench on the H100: TB/s of b = a**4 (read a + write b over the time) against the copy ceiling."""
    rows = [r for r in kf["pow4"] if not r["impl"].startswith("copy")]
    fig, ax = figure(figsize=(7.2, 4.4))
    names = [r["impl"].replace("reference Triton", "the lesson's\npow4 (Triton)").replace("eager", "eager\na*a*a*a")
             for r in rows]
    ax.barh(names, [r["tb_s"] for r in rows],
            color=[COLORS["ours"] if r["impl"].startswith("reference") else COLORS["peer"] for r in rows])
    for i, r in enumerate(rows):
        ax.text(r["tb_s"] * 0.97, i, f"{100 * r['of_copy']:.0f}%", va="center", ha="right", color="white",
                fontsize=14, fontweight="bold")
    limit(ax, copy4["tb_s"], "copy ceiling", (copy4["tb_s"], -0.62), lw=2, ha="center", fontsize=13)
    ax.invert_yaxis()
    ax.set(xlim=(0, copy4["tb_s"] * 1.12), ylim=(len(rows) - 0.5, -0.85), xlabel="TB/s (read a + write b), fp32, 1 GiB")
    return fig


def fig_dw_partials():
    """rmsnorm_backward's dw: each program sums dy·x̂ over its own run of rows into a private fp32 row;
    one .sum(0) adds the partial rows. No atomics, the same order every run."""
    fig, ax = canvas(figsize=(7.0, 5.6))
    programs, rows_per = 3, 3
    colors = [COLORS["params"], COLORS["grads"], COLORS["optimizer"]]
    row_h, top = 0.5, 6.3
    for p in range(programs):
        for r in range(rows_per):
            y = top - (p * rows_per + r) * (row_h + 0.06)
            ax.add_patch(patches.Rectangle((0, y), 2.6, row_h, facecolor=colors[p], alpha=0.8, edgecolor="white"))
            ax.text(1.3, y + row_h / 2, f"row {p * rows_per + r}: dx", ha="center", va="center", color="white",
                    fontsize=15)
        ymid = top - (p * rows_per + 1) * (row_h + 0.06) + row_h / 2
        ax.text(-0.15, ymid, f"program {p}", ha="right", va="center", fontsize=16, color=colors[p])
        yp = 5.9 - p * 1.05
        ax.add_patch(patches.Rectangle((3.9, yp), 3.0, 0.65, facecolor=colors[p], alpha=0.35, edgecolor=colors[p]))
        ax.text(5.4, yp + 0.32, f"partial[{p}], fp32", ha="center", va="center", fontsize=15)
        arrow(ax, (2.65, ymid), (3.85, yp + 0.32), lw=2.2, color=colors[p])
    ax.text(5.4, 6.75, "(programs, h)", ha="center", fontsize=15, color="#444")
    arrow(ax, (5.4, 3.7), (5.4, 2.35), lw=2.5)
    ax.text(5.55, 3.0, ".sum(0)", fontsize=16, va="center")
    ax.add_patch(patches.Rectangle((3.9, 1.65), 3.0, 0.65, facecolor=COLORS["ours"], alpha=0.9))
    ax.text(5.4, 1.97, "dw  (h,)", ha="center", va="center", color="white", fontsize=16)
    ax.text(-2.2, 0.95, "each program: dx row by row,\ndy·x̂ summed in its registers", fontsize=15, color="#444")
    ax.set(xlim=(-2.3, 7.0), ylim=(0.6, 7.0))
    return fig


def fig_swiglu_layout():
    """w13's output row: gate and up are halves 2f apart; a 2-D grid of (row, column block) programs, each writing
    its block of h."""
    fig, ax = canvas(figsize=(12, 3.6))
    blocks, bw, y_row = 4, 1.35, 2.0
    ax.text(-0.2, y_row + 0.32, "[gate | up]\nrow i", ha="right", va="center", fontsize=16)
    for half, (name, color) in enumerate((("gate", COLORS["params"]), ("up", COLORS["grads"]))):
        for b in range(blocks):
            x = half * (blocks * bw + 0.25) + b * bw
            ax.add_patch(patches.Rectangle((x, y_row), bw - 0.06, 0.64, facecolor=color, alpha=0.35 + 0.4 * (b == 1),
                                           edgecolor=color, lw=2.5 if b == 1 else 1))
            ax.text(x + bw / 2, y_row + 0.32, f"{name}[{b}]", ha="center", va="center", fontsize=15)
    px, pw = 2 * bw + 1.3, 2.7
    for half in (0, 1):
        arrow(ax, (half * (blocks * bw + 0.25) + 1 * bw + bw / 2, y_row - 0.03),
              (px + pw / 2 + (half - 0.5) * 0.6, 1.2), lw=2.2)
    _box(ax, px, 0.45, pw, 0.75, "program (i, 1)", COLORS["ours"], fontsize=16)
    hx = 8.9
    for b in range(blocks):
        ax.add_patch(patches.Rectangle((hx + b * 0.8, 0.55), 0.74, 0.55, facecolor=COLORS["optimizer"],
                                       alpha=0.35 + 0.5 * (b == 1), edgecolor=COLORS["optimizer"]))
    ax.text(hx + 1.6, 1.28, "h, row i (f wide)", ha="center", fontsize=15)
    arrow(ax, (px + pw + 0.05, 0.8), (hx + 1.2, 0.5), lw=2.2, connectionstyle="arc3,rad=0.25")
    arrow(ax, (0, y_row + 0.95), (blocks * bw * 2 + 0.25, y_row + 0.95), lw=1.5, color="#555", style="<->")
    ax.text(blocks * bw + 0.1, y_row + 1.07, "one row of w13's output: 2f values, so gate's and up's rows are 2f apart",
            ha="center", fontsize=15, color="#444")
    ax.set(xlim=(-2.0, 12.3), ylim=(0.35, 3.45))
    return fig


def fig_savings():
    """What one Llama-3.1-8B layer keeps for backward at the benchmark's token count in bf16: eager (lesson 02's
    activation_bytes) against fused, the norms and the MLP's silu(gate) split out. The difference is the lesson's
    fusion_savings_per_layer (checked here)."""
    cfg, T = sav["big"], sav["tokens"]
    r, h, f = 2, cfg.d_model, cfg.ffn_hidden
    norms_eager = 2 * (r * T * h + r * T + r * T * h)      # per norm: x, 1/rms, x̂ (lesson 02's count)
    norms_fused = 2 * (r * T * h + 4 * T)                  # per norm: x and an fp32 rstd
    silu = r * T * f
    saved = (norms_eager - norms_fused) + silu
    if saved != sav["per_layer"]:
        raise ValueError(f"the breakdown ({saved:,} B) disagrees with fusion_savings_per_layer "
                         f"({sav['per_layer']:,} B)")
    rest = sav["kept"] - norms_eager - silu
    fig, ax = figure(figsize=(7.0, 5.0))
    bars = {"eager": [rest, norms_eager, silu], "fused": [rest, norms_fused, 0]}
    labels = ["attention,\nmatmul inputs", "the two\nRMSNorms", "silu(gate)"]
    colors = [COLORS["neutral"], COLORS["params"], COLORS["activations"]]
    for i, (name, parts) in enumerate(bars.items()):
        left = 0
        for part, color in zip(parts, colors):
            ax.bar(i, part / MiB, bottom=left / MiB, color=color, width=0.6)
            left += part
        ax.text(i, left / MiB + 25, f"{left / MiB:,.0f} MiB", ha="center", fontsize=16)
    # direct labels right of the bars, at each part of the eager bar
    bottom = 0
    for part, label, color in zip(bars["eager"], labels, colors):
        ax.text(1.42, (bottom + part / 2) / MiB, label, va="center", fontsize=15, color=color, fontweight="bold")
        bottom += part
    ax.set_xticks([0, 1], list(bars), fontsize=16)
    ax.set(ylim=(0, sav["kept"] / MiB * 1.12), xlim=(-0.45, 2.5), ylabel="MiB a layer keeps for backward")
    ax.set_title(f"{cfg.name}, {T:,} tokens, bf16", fontsize=15)
    return fig
