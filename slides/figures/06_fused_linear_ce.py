"""Lesson 06's deck: the usual Gemma-2 9B arithmetic redone with the lesson's code, PyTorch's chain and the
lesson's chunked loss on the course's live-tensor meter (op by op), the tile plans of the lesson's chunk_plan,
the autograder's checks, and the H100 records (the benchmark's JSON and the JSON companion of the notebook's log)."""
from __future__ import annotations

import gc
import math
import re

import matplotlib.patches as patches
import torch

import memfit
from autograder.checks import fused_linear_ce as checks
from memfit.gpt import LLAMA_3_1_8B
from memfit.hardware import config, profile_for
from memfit.meter import LiveTensorMeter
from slides.figures import (COLORS, arrow, canvas, figure, gib, lesson, limit, log_record, markdown_table,  # noqa: F401
                            measured_on, mib, record, source)

LESSON = "06_fused_linear_ce"
BENCH = "fused_linear_ce"
# The usual example: Gemma-2 9B, vocabulary "256K", sequence 4,096, batch 8, fp32; H from the model.
TALK = dict(batch=8, seq=4096, vocab=256 * 1024, hidden=3584, itemsize=4)
# The contenders the deck compares, in the record's names, and how a slide shows them.
SHOWN = {"PyTorch, loss upcast to fp32": "PyTorch, loss in fp32", "PyTorch, bf16": "PyTorch, bf16",
         "reference": "this lesson", "reference, fp32 dW": "this lesson, fp32 dW",
         "Liger Kernel": "Liger Kernel", "Cut Cross-Entropy": "Cut Cross-Entropy"}
ref = lesson(LESSON)


# ------------------------------------------------------------------ measured here: the live-tensor meter

class _Timeline(LiveTensorMeter):
    """The live-tensor meter, keeping the live bytes after every aten op."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.steps.append((str(func.overloadpacket).replace("aten.", ""), self.current))
        return out


def _timelines() -> dict:
    """Live bytes after every aten op of (a) PyTorch's chain, loss + backward, and (b) the lesson's chunked loss
    (exercise 2, chunks of 32 tokens), on the course's live-tensor meter at the notebook's CPU size."""
    sizes = memfit.size("linear_ce", profile_for("cpu"))
    n, h, v = sizes["tokens"], sizes["hidden"], sizes["vocab"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=gen).requires_grad_()
    w = (torch.randn(v, h, generator=gen) / h**0.5).requires_grad_()
    t = torch.randint(0, v, (n,), generator=gen)
    ref.naive_linear_ce(x, w, t).backward()  # warm-up
    x.grad = w.grad = None
    gc.collect()
    chain = _Timeline()
    with chain:
        ref.naive_linear_ce(x, w, t).backward()
    chunk = 32
    gc.collect()
    chunked = _Timeline()
    with chunked:
        result = ref.chunked_linear_ce(x.detach(), w.detach(), t, chunk_size=chunk)
    del result
    return {"n": n, "h": h, "v": v, "chunk": chunk, "logits": n * v * 4, "grads": (n + v) * h * 4,
            "chain": chain.steps, "chain_peak": chain.peak, "chunked": chunked.steps,
            "chunked_peak": chunked.peak, "dtype": "fp32"}


# --------------------------------------------------------------------------------------- the H100 record

bench = record(BENCH)
heads = list(dict.fromkeys(r["head"] for r in bench[BENCH]["rows"]))


def _row(head: str, contender: str) -> dict:
    return next(r for r in bench[BENCH]["rows"] if r["head"] == head and r["contender"] == contender)


def _budget_rows(head: str) -> list[tuple[int, dict]]:
    """(d, row) for scratch budgets (dX + dW) / d, the default d = 32 being the row named 'reference'."""
    out = []
    for r in bench[BENCH]["rows"]:
        m = re.fullmatch(r"reference, scratch \(dX\+dW\)/(\d+)", r["contender"])
        if r["head"] == head and m:
            out.append((int(m.group(1)), r))
        elif r["head"] == head and r["contender"] == "reference":
            out.append((32, r))
    return sorted(out, key=lambda dr: -dr[0])


def _plan_row(label: str, n: int, h: int, v: int, itemsize: int) -> list[str]:
    budget = max((n + v) * h * itemsize // 32, 1 << 20)
    c, vc = ref.chunk_plan(n, h, v, itemsize)
    whole = vc >= v
    scratch = c * vc * itemsize + (0 if whole else c * h * 4)
    tiles = math.ceil(n / c) * math.ceil(v / vc)
    return [label, f"{n:,} × {h:,} → {v:,}", mib(budget, 1), f"{c:,} × {vc:,}",
            "whole rows" if whole else f"{math.ceil(v / vc)} tiles per row", f"{tiles:,}", mib(scratch, 1)]


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

# The example, by the lesson's arithmetic.
n_tok, v, h, b = TALK["batch"] * TALK["seq"], TALK["vocab"], TALK["hidden"], TALK["itemsize"]
logits = n_tok * v * b
per_v_h = math.ceil(v / h)
liger = ref.liger_chunk_size(n_tok, h, v)
tl = _timelines()
chain_tensors = tl["chain_peak"] / tl["logits"]
g9_logits_pow2 = f"2<sup>{logits.bit_length() - 1}</sup>" if logits & (logits - 1) == 0 else f"{logits:,}"

# Why tiles over the vocabulary: Liger's rule at the heads the benchmark measures.
gemma, llama = heads[0], heads[1]
g0 = _row(gemma, "reference")
gn, gh, gv = g0["tokens"], g0["hidden"], g0["vocab"]
g_liger = ref.liger_chunk_size(gn, gh, gv)
g_chunks = math.ceil(gn / g_liger)
gc_, gvc = ref.chunk_plan(gn, gh, gv, 2)
l0 = _row(llama, "reference")
l_liger = ref.liger_chunk_size(l0["tokens"], l0["hidden"], l0["vocab"])

# chunk_plan at four sizes: the notebook's CPU and GPU sizes and the two heads of the benchmark.
cpu = memfit.size("linear_ce", profile_for("cpu"))
t4 = memfit.size("linear_ce", profile_for("t4"))
plan_table = markdown_table(["problem", "N × H → V", "budget", "tile C × Vc", "", "tiles", "scratch"], [
    _plan_row("notebook, CPU (fp32)", cpu["tokens"], cpu["hidden"], cpu["vocab"], 4),
    _plan_row("notebook, T4/V100 (fp16)", t4["tokens"], t4["hidden"], t4["vocab"], 2),
    _plan_row(f"{gemma} head (bf16)", gn, gh, gv, 2),
    _plan_row(f"{llama} head (bf16)", l0["tokens"], LLAMA_3_1_8B.d_model, LLAMA_3_1_8B.vocab_size, 2),
    _plan_row("Gemma-2 9B, batch 8 x 4,096 (fp32)", n_tok, h, v, 4)])
cfg_cpu, cfg_gpu = config("ce_rows", profile_for("cpu")), config("ce_rows", profile_for("h100"))

# The checks.
what = {"cross_entropy_with_grad": "loss and dlogits against float64; ignored tokens, all ignored, "
                                   "sum, smoothing, softcap",
        "chunked_linear_ce": "(loss, dX, dW, db); a chunk all ignored, ragged last chunk; no N × V tensor",
        "fused_linear_ce_forward": "whole-row and vocabulary tiles, V not a multiple of the tile; bad "
                                   "inputs raise",
        "fused_linear_ce_memory": "peak ≤ dX + dW + one tile's scratch (from the tile plan); chunks None "
                                  "and given, fp32_dw; nothing kept; no PyTorch softmax",
        "fused_linear_cross_entropy": "(…, H) inputs, backward of g × loss, memory of forward + backward"}
cases = {name: ([c for c in records if not c.hidden], [c for c in records if c.hidden])
         for name, records in (("cross_entropy_with_grad", checks.CE_CASES), ("chunked_linear_ce", checks.CHUNK_CASES),
                               ("fused_linear_ce_forward", checks.TILE_CASES))}
grade_table = markdown_table(["ex.", "check", "points", "cases vis. + hid.", "what it tests"],
                             [[f"{i}", f"`{chk.name}`", f"{chk.points:g}",
                               f"{len(cases[chk.name][0])} + {len(cases[chk.name][1])}" if chk.name in cases else "—",
                               what[chk.name]] for i, chk in enumerate(checks.CHECKS, start=1)])

# The H100 record: time and memory per contender, both heads in one table.
ups = {head: _row(head, "PyTorch, loss upcast to fp32") for head in (gemma, llama)}
bench_table = markdown_table(["contender", f"{gemma} MiB", "ms", "× fp32 loss", f"{llama} MiB", "ms", "× fp32 loss"],
                             [[shown] + [cell for head in (gemma, llama) for cell in (
                                 f"{_row(head, name)['peak_mib']:,.0f}", f"{_row(head, name)['ms']:.1f}",
                                 f"{_row(head, name)['ms'] / ups[head]['ms']:.2f}×")]
                              for name, shown in SHOWN.items()])
up = ups[gemma]

# Section 8: the filter against Cut Cross-Entropy, device time (the sum of the kernels' times).
BEYOND = {"reference": "this lesson (section 4)", "filtered (section 8)": "filtered (section 8)",
          "filtered, eps 0 (every block)": "filtered, ε = 0", "Cut Cross-Entropy": "Cut Cross-Entropy",
          "Cut Cross-Entropy, no filter": "Cut Cross-Entropy, no filter"}
cces = {head: _row(head, "Cut Cross-Entropy") for head in (gemma, llama)}
beyond_table = markdown_table(
    ["contender", f"{gemma} device ms", "× CCE", f"{llama} device ms", "× CCE", "MiB / (dX + dW)"],
    [[shown] + [cell for head in (gemma, llama) for cell in (
        f"{_row(head, name)['device_ms']:.1f}", f"{_row(head, name)['device_ms'] / cces[head]['device_ms']:.2f}×")]
     + [f"{_row(gemma, name)['peak_mib'] / _row(gemma, name)['grads_mib']:.3f}"] for name, shown in BEYOND.items()])
gf = _row(gemma, "filtered (section 8)")
gf_kernels = gf["kernels_ms"]
gf_products = sum(ms for name, ms in gf_kernels.items() if name.startswith("block_sparse"))
gf_rows = sum(ms for name, ms in gf_kernels.items() if name in ("ce_stats_kernel", "ce_grad_kernel"))
g_tiles = math.ceil(gn / gc_) * math.ceil(gv / gvc)  # chunk_plan's tiles: section 8 launches 5 Triton kernels each

# The budget sweep.
sweep = {head: _budget_rows(head) for head in (gemma, llama)}
fastest = {head: min(sweep[head], key=lambda dr: dr[1]["ms"]) for head in sweep}
smallest = {head: sweep[head][0] for head in sweep}
sweep_l_fast_plan = "{:,} × {:,}".format(*ref.chunk_plan(
    l0["tokens"], l0["hidden"], l0["vocab"], 2, (l0["tokens"] + l0["vocab"]) * l0["hidden"] * 2 // fastest[llama][0]))

# The drift of dW, from the notebook's H100 log.
log = log_record("lesson06_log")
low = log["low"].replace("bfloat16", "bf16").replace("float16", "fp16")
drift_rows = [[f"{k}", f"{a:.1e}", f"{b_:.1e}", f"{a / b_:.1f}×"] for k, a, b_ in log["drift"]]
ln, lh, lv = log["sizes"]
chunked_gib, chunked_x = log["measured"]["chunked over tokens (ex. 2, PyTorch)"]
drift_table = markdown_table(["chunks of tokens", f"dW in {low}", "dW in fp32 (`fp32_dw`)", f"{low} / fp32"],
                             drift_rows)


# ------------------------------------------------------------------------------------------------ figures

# The kernels of the chain (seven: linear backward is two matmuls), as aten names the live-tensor meter sees, and
# how the figure labels them.
KERNELS = {"mm": "linear", "_log_softmax": "log_softmax", "nll_loss_forward": "nll_loss",
           "nll_loss_backward": "nll_loss\nbackward", "_log_softmax_backward_data": "log_softmax\nbackward"}
MATMULS = ["linear\n(logits)", "linear bwd\n(dX)", "linear bwd\n(dW)"]  # the chain's three mm, in order
# Where fig_chain_timeline puts each kernel's label, in points from its marker.
LABEL_AT = {"linear\n(logits)": (-30, 10), "log_softmax": (-10, 12), "nll_loss": (0, -34),
            "nll_loss\nbackward": (0, 12), "log_softmax\nbackward": (0, 12),
            "linear bwd\n(dX)": (0, 12), "linear bwd\n(dW)": (10, 12)}


def _grads_line(ax, x, dy, va):
    """dX + dW, the least any loss + backward must hold, in logits-sized tensors."""
    grads = tl["grads"] / tl["logits"]
    limit(ax, grads, "dX + dW", (x, grads + dy), vertical=False, color=COLORS["params"], lw=1.5, va=va, ha="right",
          fontsize=14)


def fig_chain_timeline():
    """PyTorch's chain, loss + backward: live memory after every aten op, in logits-sized tensors."""
    steps = tl["chain"]
    ys = [cur / tl["logits"] for _, cur in steps]
    xs = list(range(1, len(steps) + 1))
    fig, ax = figure(figsize=(10, 4.6))
    ax.step([0] + xs, [0] + ys, where="post", color=COLORS["activations"], lw=3)
    matmuls = iter(MATMULS)
    for x, (name, _), y in zip(xs, steps, ys):
        if name in KERNELS:
            label = next(matmuls) if name == "mm" else KERNELS[name]
            ax.plot([x], [y], "o", color=COLORS["activations"], ms=9)
            ax.annotate(label, (x, y), xytext=LABEL_AT[label], textcoords="offset points", ha="center", fontsize=13)
    backward = next(i for i, (name, _) in enumerate(steps) if name == "ones_like") + 1
    ax.axvline(backward - 0.5, color=COLORS["neutral"], lw=1.5, ls=":")
    top = max(ys) + 1.0
    ax.text(backward - 0.7, top - 0.15, "forward", ha="right", va="top", fontsize=14, color=COLORS["neutral"])
    ax.text(backward - 0.3, top - 0.15, "backward", ha="left", va="top", fontsize=14, color=COLORS["neutral"])
    _grads_line(ax, len(xs) + 0.8, 0.06, "bottom")
    ax.set(ylim=(0, top), xlim=(0, len(xs) + 1), xlabel="aten ops dispatched, in order",
           ylabel="live memory, in\nlogits-sized tensors")
    return fig


def fig_chunked_timeline():
    """The chain against the lesson's chunked loss (exercise 2): live memory through each call."""
    fig, ax = figure(figsize=(10, 4.4))
    for key, color, label in (("chain", COLORS["activations"], "PyTorch's chain, loss + backward"),
                              ("chunked", COLORS["ours"], f"chunked_linear_ce, chunks of {tl['chunk']} tokens")):
        steps = tl[key]
        xs = [i / len(steps) for i in range(len(steps) + 1)]
        ax.step(xs, [0] + [cur / tl["logits"] for _, cur in steps], where="post", color=color, lw=3, label=label)
    _grads_line(ax, 1.0, -0.08, "top")
    ax.set(ylim=(0, tl["chain_peak"] / tl["logits"] + 1.1),
           xlabel="progress through the call (share of its aten ops)", ylabel="live memory, in\nlogits-sized tensors")
    ax.legend(loc="upper left", frameon=False, fontsize=14, ncols=2)
    return fig


def fig_layout():
    """The logits of the benchmark's Gemma-2-2B head to scale: Liger's chunk of whole rows (exercise 2's rule)
    against the lesson's tile (chunk_plan), both from the lesson's functions."""
    n, v = gn, gv
    fig, axes = figure(ncols=2, figsize=(11, 4.6))
    for ax, title, (hgt, wid), color in (
            (axes[0], f"exercise 2 (Liger's rule): a chunk of\n{g_liger:,} tokens × all {v:,} columns", (g_liger, v),
             COLORS["grads"]),
            (axes[1], f"exercise 3 (chunk_plan): a tile of\n{gc_:,} tokens × {gvc:,} columns", (gc_, gvc),
             COLORS["ours"])):
        ax.grid(False)
        ax.add_patch(patches.Rectangle((0, 0), v, n, facecolor="#f4f4f4", edgecolor="#555", lw=1.5))
        if wid < v:
            for x0 in range(0, v, wid):
                ax.plot([x0, x0], [0, n], color="#d8d8d8", lw=0.4)
            for y0 in range(0, n, hgt):
                ax.plot([0, v], [y0, y0], color="#bbb", lw=0.8)
        ax.add_patch(patches.Rectangle((0, n - hgt), wid, hgt, facecolor=color, edgecolor=color))
        ax.set(xlim=(-v * 0.02, v * 1.02), ylim=(-n * 0.04, n * 1.04))
        ax.set_title(title, fontsize=15)
        ax.set(xticks=[0, v], xticklabels=["0", f"V = {v:,}"], yticks=[0, n],
               yticklabels=[f"N = {n:,}", "0"] if ax is axes[0] else ["", ""])
        ax.spines[["top", "right", "left", "bottom"]].set_visible(False)
    return fig


def fig_two_passes():
    """One chunk of tokens, tiles over the vocabulary: what each pass computes (a diagram)."""
    fig, ax = canvas(figsize=(11.5, 3.4))
    ax.set(xlim=(0, 11.5), ylim=(0, 3.5))
    for y, title, color in ((1.95, "pass 1: statistics", COLORS["params"]), (0.1, "pass 2: gradients", COLORS["ours"])):
        ax.text(0.05, y + 1.05, title, fontsize=16, fontweight="bold", color=color)
        for i in range(4):
            x0 = 0.1 + i * 1.0
            ax.add_patch(patches.Rectangle((x0, y), 0.9, 0.85, facecolor=color, alpha=0.25 + 0.15 * i,
                                           edgecolor=color, lw=1.5))
            ax.text(x0 + 0.45, y + 0.42, f"$x_c W_{i + 1}^T$", ha="center", va="center", fontsize=14)
        arrow(ax, (4.15, y + 0.42), (4.55, y + 0.42), style="->")
    ax.text(4.7, 2.4, "ce_stats_kernel, row by row, tile after tile:\n"
            "running max $m$ and sum $\\ell$ (online softmax),\n"
            "the target's logit $z_t$, the row's sum of logits", fontsize=15, va="center")
    ax.text(4.7, 0.55, "$\\mathrm{lse} = m + \\log \\ell$ is final; recompute each tile,\n"
            "ce_grad_kernel overwrites it with dlogits $dZ$, then\n"
            "$dW_j$ += $dZ^T x_c$,   $dX_c$ += $dZ\\, W_j$ (in fp32)", fontsize=15, va="center")
    return fig


def fig_memory():
    """The H100 record: peak memory of loss + backward per contender, both heads, against dX + dW."""
    names = list(SHOWN)
    fig, ax = figure(figsize=(10, 4.8))
    height = 0.38
    for k, head in enumerate(heads):
        vals = [_row(head, name)["peak_mib"] / 1024 for name in names]
        ys = [i + (k - 0.5) * height for i in range(len(names))]
        ax.barh(ys, vals, height=height, color=[COLORS["params"], COLORS["grads"]][k], label=head)
        for y, val in zip(ys, vals):
            ax.text(val * 1.05, y, f"{val:.1f}", va="center", fontsize=12)
    grads = g0["grads_mib"] / 1024
    limit(ax, grads, f"dX + dW ({heads[0]})", (grads * 1.04, -0.75), lw=1.5, fontsize=13)
    ax.set_xscale("log")
    top = max(r["peak_mib"] for r in bench[BENCH]["rows"]) / 1024 * 2.2
    ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50) if grads * 0.5 <= t <= top]
    ax.set(xticks=ticks, xticklabels=[f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set(yticks=range(len(names)), yticklabels=[SHOWN[n] for n in names], xlim=(grads * 0.5, top),
           xlabel="peak memory of loss + backward, GiB (log scale), gradients included", ylim=(len(names) - 0.4, -1.0))
    ax.legend(loc="lower right", frameon=True, fontsize=14)
    ax.set_title(f"{bench['device']}, bf16, {g0['tokens']:,} tokens", fontsize=15)
    return fig


def fig_sweep():
    """The H100 record: time of loss + backward against the scratch budget, (dX + dW)/128 … /8, both heads."""
    fig, ax = figure(figsize=(10, 4.8))
    for k, head in enumerate(heads):
        rows = sweep[head]
        xs = list(range(len(rows)))
        color = [COLORS["params"], COLORS["grads"]][k]
        ax.plot(xs, [r["ms"] for _, r in rows], "o-", color=color, lw=2.5, ms=9, label=f"{head}, this lesson")
        for x, (_, r) in zip(xs, rows):
            ax.text(x, 22 - 12 * k, f"{r['peak_mib'] - r['grads_mib']:.0f} MiB", fontsize=13, color=color,
                    ha="center", va="center")
        bf16 = _row(head, "PyTorch, bf16")["ms"]
        limit(ax, bf16, f"PyTorch bf16, {head}", (-0.2, bf16 + (1.5 if k == 0 else -1.5)), vertical=False, color=color,
              ls=":", lw=1.8, fontsize=13, va="bottom" if k == 0 else "top", ha="left")
    ax.set(xticks=range(len(rows)), xticklabels=[f"1/{d}" + (" (default)" if d == 32 else "") for d, _ in rows],
           xlim=(-0.3, len(rows) - 0.7), xlabel="scratch budget, a share of dX + dW (bottom: scratch measured)",
           ylabel="ms, loss + backward", ylim=(0, max(r["ms"] for h_ in heads for _, r in sweep[h_]) * 1.15))
    ax.legend(loc="upper right", frameon=False, fontsize=14)
    return fig
