"""Lesson 04's deck: the three regimes and the roofline from the notebook's recorded H100 run, the traffic of eager
PyTorch traced op by op (a**4, memfit.gpt's RMSNorm and SwiGLU) against the fused minimum, the lesson's launch
rules at Llama widths, the memory meter on the lesson's pow4, the activation bytes fusion saves (the lesson's
fusion_savings_per_layer, checked against autograd's saved tensors on course-tiny) and the make bench record."""
from __future__ import annotations

import functools

import matplotlib.patches as patches

from slides.figures import COLORS, figure, gib, lesson, markdown_table, measured_on, record, source

LESSON = "04_kernel_fusion"
MiB = 2**20


# ------------------------------------------------------------------------------------ recorded runs

@functools.cache
def _bench() -> dict:
    return record("kernel_fusion")


@functools.cache
def _notebook_run() -> dict:
    """The notebook's own run on a GPU (the three regimes, the convergence demo, the compile check), read by key from
    its log's JSON companion (python -m slides.log_records)."""
    rec = record("lesson04_log")
    return {**rec["lesson04_log"], "device": rec["device"], "torch": rec["torch"], "triton": rec["triton"],
            "date": rec["date"], "path": rec["log"]}


# -------------------------------------------------------------------------------- traced traffic

class _Trace:
    """Every aten op a function runs (views and detaches left out: they move no bytes), with the bytes it reads
    (each distinct input once) and writes. Run on meta tensors: Llama-sized shapes, nothing allocated."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        ops = self.ops = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch
                from torch.utils._pytree import tree_flatten
                out = func(*args, **(kwargs or {}))
                if func.is_view or func.__name__.startswith("detach"):
                    return out
                reads = {}
                for t in tree_flatten((args, kwargs))[0]:
                    if isinstance(t, torch.Tensor):
                        key = (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
                        reads[key] = min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
                writes = sum(t.numel() * t.element_size() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
                ops.append((func.__name__.split(".")[0], sum(reads.values()), writes))
                return out

        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(r + w for _, r, w in self.ops)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@functools.cache
def _rmsnorm_traffic(tokens: int, hidden: int) -> dict:
    """memfit.gpt.rms_norm (the formula the lesson fuses) on tokens x hidden in bf16, forward and backward traced,
    against the fused minimum: forward reads x, w and writes y, rstd; backward reads dy, x, w, rstd, writes dx, dw."""
    import torch
    from memfit.gpt import rms_norm
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16, requires_grad=True, device="meta")
    w = torch.empty(hidden, dtype=torch.bfloat16, requires_grad=True, device="meta")
    with _Trace() as fwd:
        y = rms_norm(x, w, 1e-5)
    dy = torch.empty_like(y)
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
    import torch
    from memfit.gpt import swiglu
    gate_up = torch.empty(tokens, 2 * ffn, dtype=torch.bfloat16, requires_grad=True, device="meta")
    with _Trace() as fwd:
        h = swiglu(*gate_up.chunk(2, dim=-1))
    dh = torch.empty_like(h)
    with _Trace() as bwd:
        h.backward(dh)
    return dict(eager_fwd=fwd, eager_bwd=bwd, unit=h.nbytes, shape=(tokens, ffn),
                fused_fwd=_nbytes(gate_up, h), fused_bwd=_nbytes(h, gate_up) + _nbytes(gate_up))


@functools.cache
def _traffic() -> dict:
    """Eager PyTorch traced op by op against the fused minimum (each input read once, each output written once),
    at the recorded benchmark's sizes (a**4 on 1 GiB of fp32; its first RMSNorm and SwiGLU shapes, Llama-3-8B's)."""
    import torch
    a = torch.empty((1 << 30) // 4, dtype=torch.float32, device="meta")
    with _Trace() as fwd:
        a * a * a * a
    tokens, hidden = _bench_shape("RMSNorm")
    _, ffn = _bench_shape("SwiGLU")
    return {"pow4": dict(eager_fwd=fwd, fused_fwd=_nbytes(a, a), unit=a.nbytes),
            "rmsnorm": _rmsnorm_traffic(tokens, hidden), "swiglu": _swiglu_traffic(tokens, ffn)}


def _bench_shape(kernel: str) -> tuple[int, int]:
    """(tokens, width) of the first row of the recorded benchmark whose kernel starts with `kernel`."""
    row = next(r for r in _bench()["kernel_fusion"]["kernels"] if r["kernel"].startswith(kernel))
    tokens, width = (int(v) for v in row["shape"].split(" x "))
    return tokens, width


def _passes(n_bytes: int, unit: int) -> str:
    p = n_bytes / unit
    return f"{p:.0f}" if abs(p - round(p)) < 0.05 else f"{p:.1f}"


# ------------------------------------------------------------------------------------ measured here

@functools.cache
def _meter() -> dict:
    """Eager a*a*a*a against the lesson's pow4 on the course's memory meter, here and now."""
    import memfit
    import torch
    ref = lesson(LESSON)
    n = 1 << 16
    a = torch.randn(n, device=memfit.DEVICE)
    _, eager = memfit.measure_peak(lambda: a * a * a * a)
    _, fused = memfit.measure_peak(lambda: ref.pow4(a))
    return {"n": n, "output": a.nbytes, "eager": eager.peak_bytes, "fused": fused.peak_bytes}


@functools.cache
def _savings() -> dict:
    """The lesson's fusion_savings_per_layer on course-tiny against the autograd-saved bytes the check measures,
    and at Llama-3.1-8B scale against the bytes a layer keeps (lesson 02's activation_bytes)."""
    import torch
    from autograder.checks.kernel_fusion import measured_savings
    from memfit.from_lessons.activations import activation_bytes
    from memfit.gpt import COURSE_CONFIGS, LLAMA_3_1_8B
    ref = lesson(LESSON)
    tiny = COURSE_CONFIGS["tiny"]
    batch, seq = 2, 16
    measured = measured_savings(tiny, batch, seq, torch.float32, ref.use_fused_kernels)
    formula = ref.fusion_savings_per_layer(tiny, batch, seq, 4)
    big, (tokens, _) = LLAMA_3_1_8B, _bench_shape("RMSNorm")
    per_layer = ref.fusion_savings_per_layer(big, 1, tokens, 2)
    kept = activation_bytes(big, 1, tokens, "bf16")
    return {"tiny": tiny, "batch": batch, "seq": seq, "measured": measured, "formula": formula,
            "big": big, "tokens": tokens, "per_layer": per_layer, "kept": kept}


# ------------------------------------------------------------------------------------------ tables

def _launch_rows() -> list[list[str]]:
    """The lesson's launch rules at the hidden sizes of the Llama family."""
    import triton
    from memfit.gpt import LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B
    ref = lesson(LESSON)
    rows = []
    for cfg in (LLAMA_3_2_1B, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B):
        block = triton.next_power_of_2(cfg.d_model)
        warps = ref._row_warps(block)
        rows.append([cfg.name, f"{cfg.d_model:,}", f"{block:,}", str(warps), str(block // (32 * warps)),
                     str(max(1, 16 // warps))])
    return rows


def _kernel_rows() -> list[list[str]]:
    """make bench's forward + backward times, with the fused minimum traffic over the recorded copy bandwidth."""
    bench = _bench()["kernel_fusion"]
    copy = next(r for r in bench["pow4"] if r["impl"].startswith("copy"))
    bps = copy["tb_s"] * 1e12
    rows = []
    for k in bench["kernels"]:
        tokens, width = (int(v) for v in k["shape"].split(" x "))
        tr = (_rmsnorm_traffic if k["kernel"].startswith("RMSNorm") else _swiglu_traffic)(tokens, width)
        minimum = tr["fused_fwd"] + tr["fused_bwd"]
        bound = minimum / bps * 1e3
        rows.append([k["kernel"].replace(" fwd+bwd", ""), k["shape"].replace(" x ", " × "), f"{k['eager']:.2f}",
                     f"{k['torch.compile']:.2f}", f"**{k['reference Triton']:.2f}**", f"{bound:.2f}",
                     f"{100 * bound / k['reference Triton']:.0f}%"])
    return rows


def _kernel_stats() -> dict:
    """What the bench's RMSNorm/SwiGLU rows say: how close each kernel gets to its bound, where compile trails most."""
    bench = _bench()["kernel_fusion"]
    copy = next(r for r in bench["pow4"] if r["impl"].startswith("copy"))
    share = {"RMSNorm": [], "SwiGLU": []}
    for k in bench["kernels"]:
        tokens, width = (int(v) for v in k["shape"].split(" x "))
        tr = (_rmsnorm_traffic if k["kernel"].startswith("RMSNorm") else _swiglu_traffic)(tokens, width)
        bound = (tr["fused_fwd"] + tr["fused_bwd"]) / (copy["tb_s"] * 1e12) * 1e3
        share[k["kernel"].split()[0]].append(100 * bound / k["reference Triton"])
    worst = max(bench["kernels"], key=lambda k: k["speedup_vs_compile"])

    def span(values):
        lo, hi = f"{min(values):.0f}", f"{max(values):.0f}"
        return f"{lo}%" if lo == hi else f"{lo}–{hi}%"
    return {"sw_share": span(share["SwiGLU"]), "rms_share": span(share["RMSNorm"]),
            "compile_worst_shape": f"{worst['kernel'].split()[0]} {worst['shape'].replace(' x ', ' × ')}",
            "compile_worst_ratio": f"{worst['speedup_vs_compile']:.1f}"}


def _check_rows() -> list[list[str]]:
    from autograder.checks.kernel_fusion import CHECKS
    what = {
        "pow4_numerics": "lengths off the block size, fp32/fp16 (+bf16 on GPUs), `out=` inside a NaN-poisoned buffer",
        "pow4_memory": "peak ≤ the output + 5%; no PyTorch arithmetic",
        "rmsnorm_forward": "y and fp32 `rstd` vs fp64; any leading dims; peak ≤ y + rstd + 5%",
        "rmsnorm_backward": "dx and dw (summed over all rows) vs autograd in fp64",
        "swiglu": "gate, up as strided halves of one tensor; dgate and dup in one tensor; peak ≤ it + 5%",
        "fused_gpt": "course-tiny: every gradient within 1e-4, loss curves within 0.1%",
        "fusion_savings": "your bytes = autograd's saved tensors, eager − fused, exactly",
    }
    return [[f"`{c.name}`", f"{c.points:g}", what[c.name]] for c in CHECKS]


def _two_digits(x: float) -> str:
    """x to two significant digits, with thousands separators: 2165.3 -> '2,200'."""
    from math import floor, log10
    return f"{round(x, 1 - floor(log10(abs(x)))):,.0f}"


def _ridge() -> float:
    nb = _notebook_run()
    return nb["mm_flops"] / _roof_bandwidth()


def _roof_bandwidth() -> float:
    """The bandwidth roof: make bench's copy of 1 GiB (the ceiling its pow4 rows are measured against)."""
    copy = next(r for r in _bench()["kernel_fusion"]["pow4"] if r["impl"].startswith("copy"))
    return copy["tb_s"] * 1e12


# ---------------------------------------------------------------------------------------- figures

def _box(ax, x, y, w, h, text, color, fontsize=14, text_color="white", alpha=0.9, **kw):
    ax.add_patch(patches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                        facecolor=color, edgecolor=color, alpha=alpha, **kw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def fig_pipeline():
    """Where an op's time goes: CPU launch -> HBM -> on-chip SRAM/registers -> compute, each a bottleneck,
    with the notebook's measured H100 numbers."""
    nb = _notebook_run()
    fig, ax = figure(figsize=(13, 3.3))
    ax.axis("off")
    ax.grid(False)
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
        ax.annotate("", xy=(x0 + gap - 0.05, 1.65), xytext=(x0 + 0.05, 1.65),
                    arrowprops=dict(arrowstyle="-|>", lw=3, color="#333"))
        ax.text(x0 + gap / 2, 2.6, regime, ha="center", fontsize=18, color=COLORS["activations"], fontweight="bold")
        ax.text(x0 + gap / 2, 0.45, number, ha="center", fontsize=16, color="#333")
    ax.set_xlim(-0.1, 4 * w + 3 * gap + 0.1)
    ax.set_ylim(0.25, 3.0)
    return fig


def fig_roofline():
    """The H100 roofline from measured ceilings, and the lesson's kernels on it."""
    import numpy as np
    nb = _notebook_run()
    bw, peak = _roof_bandwidth(), nb["mm_flops"]
    pow4 = {r["impl"]: r for r in _bench()["kernel_fusion"]["pow4"]}
    p4 = _traffic()["pow4"]
    fig, ax = figure(figsize=(7.4, 5.4))
    intensity = np.logspace(-2, 4, 300)
    ax.loglog(intensity, np.minimum(peak, intensity * bw), color="#222", lw=2.5)
    ridge = peak / bw
    ax.axvline(ridge, color=COLORS["neutral"], ls=":", lw=1.5)
    ax.text(ridge * 1.15, peak * 0.012, f"ridge ≈ {ridge:,.0f}\nFLOP/byte", fontsize=13, color="#555")
    # measured points (filled): x*x (notebook), a**4 eager and fused (make bench), the matmul ceiling
    n_elems = pow4["reference Triton"]["tb_s"] * 1e12 * pow4["reference Triton"]["ms"] / 1e3 / 8
    eager_flops_per_elem = len(p4["eager_fwd"].ops)  # one multiply per traced kernel
    eager_bytes_per_elem = p4["eager_fwd"].bytes / (p4["unit"] / 4)
    measured = [
        ("x*x", 1 / 8, nb["square_bps"] / 8, (10, -16)),
        ("a⁴ eager", eager_flops_per_elem / eager_bytes_per_elem,
         eager_flops_per_elem * n_elems / (pow4["eager"]["ms"] / 1e3), (-92, 6)),
        ("a⁴ fused", 2 / 8, 2 * n_elems / (pow4["reference Triton"]["ms"] / 1e3), (10, -16)),
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
    ax.set_xlabel("arithmetic intensity I (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_xlim(1e-2, 1e4)
    ax.set_ylim(1e11, peak * 8)
    return fig


def fig_pow4_traffic():
    """Eager a*a*a*a: three kernels, each a round trip through HBM; fused: one kernel, one read, one write.
    Reads and writes per kernel from the trace."""
    tr = _traffic()["pow4"]
    ops = tr["eager_fwd"].ops
    unit = tr["unit"]
    fig, ax = figure(figsize=(12, 4.6))
    ax.axis("off")
    ax.grid(False)
    names = ["t1 = a·a", "t2 = t1·a", "b = t2·a"]
    hbm_y, k_y, kh, kw = 0.0, 1.3, 0.9, 2.3

    def hbm(x0, x1, label):
        ax.add_patch(patches.Rectangle((x0, hbm_y), x1 - x0, 0.55, facecolor=COLORS["params"], alpha=0.25,
                                       edgecolor=COLORS["params"]))
        ax.text(x0 + 0.1, hbm_y + 0.27, label, va="center", fontsize=13, color=COLORS["params"])

    def arrows(x, reads, writes):
        for j in range(reads):
            xx = x + 0.45 + 0.3 * j
            ax.annotate("", xy=(xx, k_y - 0.02), xytext=(xx, hbm_y + 0.57),
                        arrowprops=dict(arrowstyle="-|>", lw=2.2, color=COLORS["optimizer"]))
        xx = x + kw - 0.45
        for j in range(writes):
            ax.annotate("", xy=(xx - 0.3 * j, hbm_y + 0.57), xytext=(xx - 0.3 * j, k_y - 0.02),
                        arrowprops=dict(arrowstyle="-|>", lw=2.2, color=COLORS["activations"]))

    hbm(-0.2, 8.7, "HBM")
    for i, ((op, r, w), name) in enumerate(zip(ops, names)):
        x = i * 2.9
        _box(ax, x, k_y, kw, kh, f"kernel {i + 1}\n{name}", COLORS["neutral"], fontsize=14)
        arrows(x, round(r / unit), round(w / unit))
    ax.text(4.25, 2.55, f"eager: {len(ops)} kernels, {_passes(tr['eager_fwd'].bytes, unit)} passes over memory, "
            "2 temporaries", ha="center", fontsize=15, fontweight="bold")
    hbm(9.5, 12.6, "HBM")
    _box(ax, 9.9, k_y, kw, kh, "pow4\n(a·a)² in registers", COLORS["ours"], fontsize=14)
    arrows(9.9, 1, 1)
    ax.text(11.05, 2.55, f"fused: 1 kernel, {_passes(tr['fused_fwd'], unit)} passes", ha="center", fontsize=15,
            fontweight="bold", color=COLORS["ours"])
    ax.text(0.37, 0.9, "read", fontsize=14, ha="right", color=COLORS["optimizer"])
    ax.text(1.93, 0.9, "write", fontsize=14, ha="left", color=COLORS["activations"])
    ax.set_xlim(-0.3, 12.7)
    ax.set_ylim(-0.2, 2.9)
    return fig


def fig_pow4_bench():
    """make bench on the H100: TB/s of b = a**4 (read a + write b over the time) against the copy ceiling."""
    bench = _bench()
    rows = [r for r in bench["kernel_fusion"]["pow4"] if not r["impl"].startswith("copy")]
    copy = next(r for r in bench["kernel_fusion"]["pow4"] if r["impl"].startswith("copy"))
    fig, ax = figure(figsize=(7.2, 4.4))
    names = [r["impl"].replace("reference Triton", "the lesson's\npow4 (Triton)").replace("eager", "eager\na*a*a*a")
             for r in rows]
    colors = [COLORS["ours"] if r["impl"].startswith("reference") else COLORS["peer"] for r in rows]
    ax.barh(names, [r["tb_s"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        ax.text(r["tb_s"] * 0.97, i, f"{100 * r['of_copy']:.0f}%", va="center", ha="right", color="white",
                fontsize=14, fontweight="bold")
    ax.axvline(copy["tb_s"], color=COLORS["activations"], ls="--", lw=2)
    ax.text(copy["tb_s"], -0.62, "copy ceiling", color=COLORS["activations"], ha="center", fontsize=13)
    ax.invert_yaxis()
    ax.set_xlim(0, copy["tb_s"] * 1.12)
    ax.set_ylim(len(rows) - 0.5, -0.85)
    ax.set_xlabel("TB/s (read a + write b), fp32, 1 GiB")
    return fig


def fig_dw_partials():
    """rmsnorm_backward's dw: each program sums dy·x̂ over its own run of rows into a private fp32 row;
    one .sum(0) adds the partial rows. No atomics, the same order every run."""
    fig, ax = figure(figsize=(7.0, 5.6))
    ax.axis("off")
    ax.grid(False)
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
        ax.annotate("", xy=(3.85, yp + 0.32), xytext=(2.65, ymid),
                    arrowprops=dict(arrowstyle="-|>", lw=2.2, color=colors[p]))
    ax.text(5.4, 6.75, "(programs, h)", ha="center", fontsize=15, color="#444")
    ax.annotate("", xy=(5.4, 2.35), xytext=(5.4, 3.7), arrowprops=dict(arrowstyle="-|>", lw=2.5, color="#333"))
    ax.text(5.55, 3.0, ".sum(0)", fontsize=16, va="center")
    ax.add_patch(patches.Rectangle((3.9, 1.65), 3.0, 0.65, facecolor=COLORS["ours"], alpha=0.9))
    ax.text(5.4, 1.97, "dw  (h,)", ha="center", va="center", color="white", fontsize=16)
    ax.text(-2.2, 0.95, "each program: dx row by row,\ndy·x̂ summed in its registers", fontsize=15, color="#444")
    ax.set_xlim(-2.3, 7.0)
    ax.set_ylim(0.6, 7.0)
    return fig


def fig_swiglu_layout():
    """w13's output row: gate and up are halves 2f apart; a 2-D grid of (row, column block) programs, each writing
    its block of h."""
    fig, ax = figure(figsize=(12, 3.6))
    ax.axis("off")
    ax.grid(False)
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
        x = half * (blocks * bw + 0.25) + 1 * bw + bw / 2
        ax.annotate("", xy=(px + pw / 2 + (half - 0.5) * 0.6, 1.2), xytext=(x, y_row - 0.03),
                    arrowprops=dict(arrowstyle="-|>", lw=2.2, color="#333"))
    _box(ax, px, 0.45, pw, 0.75, "program (i, 1)", COLORS["ours"], fontsize=16)
    hx = 8.9
    for b in range(blocks):
        ax.add_patch(patches.Rectangle((hx + b * 0.8, 0.55), 0.74, 0.55, facecolor=COLORS["optimizer"],
                                       alpha=0.35 + 0.5 * (b == 1), edgecolor=COLORS["optimizer"]))
    ax.text(hx + 1.6, 1.28, "h, row i (f wide)", ha="center", fontsize=15)
    ax.annotate("", xy=(hx + 1.2, 0.5), xytext=(px + pw + 0.05, 0.8),
                arrowprops=dict(arrowstyle="-|>", lw=2.2, color="#333", connectionstyle="arc3,rad=0.25"))
    ax.annotate("", xy=(blocks * bw * 2 + 0.25, y_row + 0.95), xytext=(0, y_row + 0.95),
                arrowprops=dict(arrowstyle="<->", lw=1.5, color="#555"))
    ax.text(blocks * bw + 0.1, y_row + 1.07, "one row of w13's output: 2f values, so gate's and up's rows are 2f apart",
            ha="center", fontsize=15, color="#444")
    ax.set_xlim(-2.0, 12.3)
    ax.set_ylim(0.35, 3.45)
    return fig


def fig_savings():
    """What one Llama-3.1-8B layer keeps for backward at the benchmark's token count in bf16: eager (lesson 02's
    activation_bytes) against fused, the norms and the MLP's silu(gate) split out. The difference is the lesson's
    fusion_savings_per_layer (checked here)."""
    sav = _savings()
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
    ax.set_ylim(0, sav["kept"] / MiB * 1.12)
    ax.set_xlim(-0.45, 2.5)
    ax.set_ylabel("MiB a layer keeps for backward")
    ax.set_title(f"{cfg.name}, {T:,} tokens, bf16", fontsize=15)
    return fig


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

import torch
from autograder.checks.kernel_fusion import CHECKS
from memfit.hardware import KNOWN_GPUS, KiB, config
ref = lesson(LESSON)
nb = _notebook_run()
bench = _bench()
pow4 = {r["impl"]: r for r in bench["kernel_fusion"]["pow4"]}
eager4, ours4, compiled4, copy4 = (pow4["eager"], pow4["reference Triton"], pow4["torch.compile"],
                                   pow4["copy (ceiling)"])
tr = _traffic()
p4, rms, sw = tr["pow4"], tr["rmsnorm"], tr["swiglu"]
mm_bytes = torch.empty((), dtype=getattr(torch, nb["mm_dtype"])).element_size()
mm_intensity = 2 * nb["mm_n"] ** 3 / (3 * nb["mm_n"] ** 2 * mm_bytes)  # the lesson's n / (1.5 bytes)
tiny_op = 2 * nb["tiny_elements"] * 4  # the notebook's tiny op reads and writes that many fp32 values
meter = _meter()
sav = _savings()
sweep = bench["kernel_fusion"]["rmsnorm_backward_programs"]
import triton
sweep_rows, verdict = [], []
for hidden, times in sweep.items():
    chosen = str(max(1, 16 // ref._row_warps(triton.next_power_of_2(int(hidden)))))
    best = min(times, key=times.get)
    sweep_rows.append([f"{int(hidden):,}"] + [f"**{v:.3f}**" if k == chosen else f"{v:.3f}"
                                              for k, v in times.items()])
    verdict.append(f"at hidden {int(hidden):,} the rule's choice is the fastest" if best == chosen else
                   f"at hidden {int(hidden):,}, {best} per SM beats the rule's {chosen} by "
                   f"{100 * (times[chosen] / times[best] - 1):.0f}%")
kern = _kernel_stats()
t4 = nb["compile_t4"]
tokens, ffn = _bench_shape("SwiGLU")
mlp_saved = 2 * sav["tokens"] * sav["big"].ffn_hidden
launch_table = (markdown_table(["model", "hidden h", "BLOCK", "num_warps", "values / thread",
                                        "bwd programs / SM"], _launch_rows()))
sweep_table = (markdown_table(["hidden"] + [f"{k} per SM" for k in next(iter(sweep.values()))],
                                      sweep_rows))
kernels_table = (markdown_table(["kernel", "tokens × width", "eager", "compile", "ours", "bound",
                                         "ours at"], _kernel_rows()))
