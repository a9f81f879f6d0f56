"""Lesson 06's deck: the usual Gemma-2 9B arithmetic redone with the lesson's code, PyTorch's chain and the
lesson's chunked loss on the course's live-tensor meter (op by op), the tile plans of the lesson's chunk_plan,
the autograder's checks, and the H100 records (the benchmark's JSON and the JSON companion of the notebook's log)."""
from __future__ import annotations

import functools
import gc
import math
import re

import matplotlib.patches as patches

from slides.figures import COLORS, figure, gib, lesson, markdown_table, measured_on, record, source

LESSON = "06_fused_linear_ce"
BENCH = "fused_linear_ce"
# The usual example: Gemma-2 9B, vocabulary "256K", sequence 4,096, batch 8, fp32; H from the model.
TALK = dict(batch=8, seq=4096, vocab=256 * 1024, hidden=3584, itemsize=4)
# The contenders the deck compares, in the record's names, and how a slide shows them.
SHOWN = {"PyTorch, loss upcast to fp32": "PyTorch, loss in fp32", "PyTorch, bf16": "PyTorch, bf16",
         "reference": "this lesson", "reference, fp32 dW": "this lesson, fp32 dW",
         "Liger Kernel": "Liger Kernel", "Cut Cross-Entropy": "Cut Cross-Entropy"}


def _ref():
    return lesson(LESSON)


def _mib(n_bytes: float, digits: int = 0) -> str:
    return f"{n_bytes / 2**20:,.{digits}f} MiB"


# ------------------------------------------------------------------ measured here: the live-tensor meter

@functools.cache
def _timelines() -> dict:
    """Live bytes after every aten op of (a) PyTorch's chain, loss + backward, and (b) the lesson's chunked loss
    (exercise 2, chunks of 32 tokens), on the course's live-tensor meter at the notebook's CPU size."""
    import memfit
    import torch
    from memfit.meter import LiveTensorMeter

    class Timeline(LiveTensorMeter):
        def __init__(self):
            super().__init__()
            self.steps = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            self.steps.append((str(func.overloadpacket).replace("aten.", ""), self.current))
            return out

    ref = _ref()
    sizes = memfit.size("linear_ce", memfit.hardware.profile_for("cpu"))
    n, h, v = sizes["tokens"], sizes["hidden"], sizes["vocab"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=gen).requires_grad_()
    w = (torch.randn(v, h, generator=gen) / h**0.5).requires_grad_()
    t = torch.randint(0, v, (n,), generator=gen)
    ref.naive_linear_ce(x, w, t).backward()  # warm-up
    x.grad = w.grad = None
    gc.collect()
    chain = Timeline()
    with chain:
        ref.naive_linear_ce(x, w, t).backward()
    chunk = 32
    gc.collect()
    chunked = Timeline()
    with chunked:
        result = ref.chunked_linear_ce(x.detach(), w.detach(), t, chunk_size=chunk)
    del result
    return {"n": n, "h": h, "v": v, "chunk": chunk, "logits": n * v * 4, "grads": (n + v) * h * 4,
            "chain": chain.steps, "chain_peak": chain.peak, "chunked": chunked.steps,
            "chunked_peak": chunked.peak, "dtype": "fp32"}


def _rows(head: str | None = None) -> list[dict]:
    rows = record(BENCH)[BENCH]["rows"]
    return [r for r in rows if head is None or r["head"] == head]


def _heads() -> list[str]:
    return list(dict.fromkeys(r["head"] for r in _rows()))


def _row(head: str, contender: str) -> dict:
    return next(r for r in _rows(head) if r["contender"] == contender)


def _budget_rows(head: str) -> list[tuple[int, dict]]:
    """(d, row) for scratch budgets (dX + dW) / d, the default d = 32 being the row named 'reference'."""
    out = []
    for r in _rows(head):
        m = re.fullmatch(r"reference, scratch \(dX\+dW\)/(\d+)", r["contender"])
        if m:
            out.append((int(m.group(1)), r))
        elif r["contender"] == "reference":
            out.append((32, r))
    return sorted(out, key=lambda dr: -dr[0])


def _plan_row(label: str, n: int, h: int, v: int, itemsize: int) -> list[str]:
    ref = _ref()
    budget = max((n + v) * h * itemsize // 32, 1 << 20)
    c, vc = ref.chunk_plan(n, h, v, itemsize)
    whole = vc >= v
    scratch = c * vc * itemsize + (0 if whole else c * h * 4)
    tiles = math.ceil(n / c) * math.ceil(v / vc)
    return [label, f"{n:,} × {h:,} → {v:,}", _mib(budget, 1), f"{c:,} × {vc:,}",
            "whole rows" if whole else f"{math.ceil(v / vc)} tiles per row", f"{tiles:,}", _mib(scratch, 1)]


# ------------------------------------------------------------------------------------------------ figures

# The kernels of the chain (seven: linear backward is two matmuls), as aten names the live-tensor meter sees, and how the figure labels them.
KERNELS = {"mm": "linear", "_log_softmax": "log_softmax", "nll_loss_forward": "nll_loss",
           "nll_loss_backward": "nll_loss\nbackward", "_log_softmax_backward_data": "log_softmax\nbackward"}


# Where fig_chain_timeline puts each kernel's label, in points from its marker.
LABEL_AT = {"linear\n(logits)": (-30, 10), "log_softmax": (-10, 12), "nll_loss": (0, -34),
            "nll_loss\nbackward": (0, 12), "log_softmax\nbackward": (0, 12),
            "linear bwd\n(dX)": (0, 12), "linear bwd\n(dW)": (10, 12)}


def fig_chain_timeline():
    """PyTorch's chain, loss + backward: live memory after every aten op, in logits-sized tensors."""
    tl = _timelines()
    steps = tl["chain"]
    ys = [cur / tl["logits"] for _, cur in steps]
    xs = list(range(1, len(steps) + 1))
    fig, ax = figure(figsize=(10, 4.6))
    ax.step([0] + xs, [0] + ys, where="post", color=COLORS["activations"], lw=3)
    mm_seen = 0
    for x, (name, _), y in zip(xs, steps, ys):
        if name not in KERNELS:
            continue
        label = KERNELS[name]
        if name == "mm":
            label = ["linear\n(logits)", "linear bwd\n(dX)", "linear bwd\n(dW)"][mm_seen]
            mm_seen += 1
        ax.plot([x], [y], "o", color=COLORS["activations"], ms=9)
        ax.annotate(label, (x, y), xytext=LABEL_AT[label], textcoords="offset points", ha="center", fontsize=13)
    backward = next(i for i, (name, _) in enumerate(steps) if name == "ones_like") + 1
    ax.axvline(backward - 0.5, color=COLORS["neutral"], lw=1.5, ls=":")
    top = max(ys) + 1.0
    ax.text(backward - 0.7, top - 0.15, "forward", ha="right", va="top", fontsize=14, color=COLORS["neutral"])
    ax.text(backward - 0.3, top - 0.15, "backward", ha="left", va="top", fontsize=14, color=COLORS["neutral"])
    grads = tl["grads"] / tl["logits"]
    ax.axhline(grads, color=COLORS["params"], ls="--", lw=1.5)
    ax.text(len(xs) + 0.8, grads + 0.06, "dX + dW", color=COLORS["params"], va="bottom", ha="right", fontsize=14)
    ax.set_ylim(0, top)
    ax.set_xlim(0, len(xs) + 1)
    ax.set_xlabel("aten ops dispatched, in order")
    ax.set_ylabel("live memory, in\nlogits-sized tensors")
    return fig


def fig_chunked_timeline():
    """The chain against the lesson's chunked loss (exercise 2): live memory through each call."""
    tl = _timelines()
    fig, ax = figure(figsize=(10, 4.4))
    for key, color, label in (("chain", COLORS["activations"], "PyTorch's chain, loss + backward"),
                              ("chunked", COLORS["ours"],
                               f"chunked_linear_ce, chunks of {tl['chunk']} tokens")):
        steps = tl[key]
        xs = [i / len(steps) for i in range(len(steps) + 1)]
        ax.step(xs, [0] + [cur / tl["logits"] for _, cur in steps], where="post", color=color, lw=3, label=label)
    grads = tl["grads"] / tl["logits"]
    ax.axhline(grads, color=COLORS["params"], ls="--", lw=1.5)
    ax.text(1.0, grads - 0.08, "dX + dW", color=COLORS["params"], va="top", ha="right", fontsize=14)
    ax.set_ylim(0, tl["chain_peak"] / tl["logits"] + 1.1)
    ax.set_xlabel("progress through the call (share of its aten ops)")
    ax.set_ylabel("live memory, in\nlogits-sized tensors")
    ax.legend(loc="upper left", frameon=False, fontsize=14, ncols=2)
    return fig


def fig_layout():
    """The logits of the benchmark's Gemma-2-2B head to scale: Liger's chunk of whole rows (exercise 2's rule)
    against the lesson's tile (chunk_plan), both from the lesson's functions."""
    ref = _ref()
    g = _row(_heads()[0], "reference")
    n, h, v = g["tokens"], g["hidden"], g["vocab"]
    rows = ref.liger_chunk_size(n, h, v)
    c, vc = ref.chunk_plan(n, h, v, 2)
    fig, axes = figure(ncols=2, figsize=(11, 4.6))
    for ax, title, (hgt, wid), color in (
            (axes[0], f"exercise 2 (Liger's rule): a chunk of\n{rows:,} tokens × all {v:,} columns", (rows, v),
             COLORS["grads"]),
            (axes[1], f"exercise 3 (chunk_plan): a tile of\n{c:,} tokens × {vc:,} columns", (c, vc), COLORS["ours"])):
        ax.grid(False)
        ax.add_patch(patches.Rectangle((0, 0), v, n, facecolor="#f4f4f4", edgecolor="#555", lw=1.5))
        if wid < v:
            for x0 in range(0, v, wid):
                ax.plot([x0, x0], [0, n], color="#d8d8d8", lw=0.4)
            for y0 in range(0, n, hgt):
                ax.plot([0, v], [y0, y0], color="#bbb", lw=0.8)
        ax.add_patch(patches.Rectangle((0, n - hgt), wid, hgt, facecolor=color, edgecolor=color))
        ax.set_xlim(-v * 0.02, v * 1.02)
        ax.set_ylim(-n * 0.04, n * 1.04)
        ax.set_title(title, fontsize=15)
        ax.set_xticks([0, v])
        ax.set_xticklabels(["0", f"V = {v:,}"])
        ax.set_yticks([0, n])
        ax.set_yticklabels([f"N = {n:,}", "0"] if ax is axes[0] else ["", ""])
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
    return fig


def fig_two_passes():
    """One chunk of tokens, tiles over the vocabulary: what each pass computes (a diagram)."""
    fig, ax = figure(figsize=(11.5, 3.4))
    ax.grid(False)
    ax.axis("off")
    ax.set_xlim(0, 11.5)
    ax.set_ylim(0, 3.5)
    n_tiles = 4
    for y, title, color in ((1.95, "pass 1: statistics", COLORS["params"]), (0.1, "pass 2: gradients", COLORS["ours"])):
        ax.text(0.05, y + 1.05, title, fontsize=16, fontweight="bold", color=color)
        for i in range(n_tiles):
            x0 = 0.1 + i * 1.0
            ax.add_patch(patches.Rectangle((x0, y), 0.9, 0.85, facecolor=color, alpha=0.25 + 0.15 * i,
                                           edgecolor=color, lw=1.5))
            ax.text(x0 + 0.45, y + 0.42, f"$x_c W_{i + 1}^T$", ha="center", va="center", fontsize=14)
        ax.annotate("", xy=(4.55, y + 0.42), xytext=(4.15, y + 0.42),
                    arrowprops=dict(arrowstyle="->", lw=2, color="#333"))
    ax.text(4.7, 2.4, "ce_stats_kernel, row by row, tile after tile:\n"
            "running max $m$ and sum $\\ell$ (online softmax),\n"
            "the target's logit $z_t$, the row's sum of logits", fontsize=15, va="center")
    ax.text(4.7, 0.55, "$\\mathrm{lse} = m + \\log \\ell$ is final; recompute each tile,\n"
            "ce_grad_kernel overwrites it with dlogits $dZ$, then\n"
            "$dW_j$ += $dZ^T x_c$,   $dX_c$ += $dZ\\, W_j$ (in fp32)", fontsize=15, va="center")
    return fig


def fig_memory():
    """The H100 record: peak memory of loss + backward per contender, both heads, against dX + dW."""
    rec = record(BENCH)
    heads = _heads()
    names = list(SHOWN)
    fig, ax = figure(figsize=(10, 4.8))
    height = 0.38
    for k, head in enumerate(heads):
        vals = [_row(head, name)["peak_mib"] / 1024 for name in names]
        ys = [i + (k - 0.5) * height for i in range(len(names))]
        ax.barh(ys, vals, height=height, color=[COLORS["params"], COLORS["grads"]][k], label=head)
        for y, val in zip(ys, vals):
            ax.text(val * 1.05, y, f"{val:.1f}", va="center", fontsize=12)
    grads = _row(heads[0], "reference")["grads_mib"] / 1024
    ax.axvline(grads, color=COLORS["activations"], ls="--", lw=1.5)
    ax.text(grads * 1.04, -0.75, f"dX + dW ({heads[0]})", color=COLORS["activations"], fontsize=13)
    ax.set_xscale("log")
    ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50) if grads * 0.5 <= t <= max(r["peak_mib"] for r in _rows()) / 1024 * 2.2]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([SHOWN[n] for n in names])
    ax.set_xlim(grads * 0.5, max(r["peak_mib"] for r in _rows()) / 1024 * 2.2)
    ax.set_xlabel("peak memory of loss + backward, GiB (log scale), gradients included")
    ax.set_ylim(len(names) - 0.4, -1.0)
    ax.legend(loc="lower right", frameon=True, fontsize=14)
    ax.set_title(f"{rec['device']}, bf16, {_row(heads[0], 'reference')['tokens']:,} tokens", fontsize=15)
    return fig


def fig_sweep():
    """The H100 record: time of loss + backward against the scratch budget, (dX + dW)/128 … /8, both heads."""
    heads = _heads()
    fig, ax = figure(figsize=(10, 4.8))
    for k, head in enumerate(heads):
        rows = _budget_rows(head)
        xs = list(range(len(rows)))
        ys = [r["ms"] for _, r in rows]
        color = [COLORS["params"], COLORS["grads"]][k]
        ax.plot(xs, ys, "o-", color=color, lw=2.5, ms=9, label=f"{head}, this lesson")
        for x, (_, r) in zip(xs, rows):
            ax.text(x, 22 - 12 * k, f"{r['peak_mib'] - r['grads_mib']:.0f} MiB", fontsize=13, color=color,
                    ha="center", va="center")
        bf16 = _row(head, "PyTorch, bf16")["ms"]
        ax.axhline(bf16, color=color, ls=":", lw=1.8)
        ax.text(-0.2, bf16 + (1.5 if k == 0 else -1.5), f"PyTorch bf16, {head}", color=color, fontsize=13,
                va="bottom" if k == 0 else "top", ha="left")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"1/{d}" + (" (default)" if d == 32 else "") for d, _ in rows])
    ax.set_xlim(-0.3, len(rows) - 0.7)
    ax.set_xlabel("scratch budget, a share of dX + dW (bottom: scratch measured)")
    ax.set_ylabel("ms, loss + backward")
    ax.set_ylim(0, max(r["ms"] for h in heads for _, r in _budget_rows(h)) * 1.15)
    ax.legend(loc="upper right", frameon=False, fontsize=14)
    return fig


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

import memfit
import torch
from autograder.checks import fused_linear_ce as checks
from memfit.gpt import LLAMA_3_1_8B
from memfit.hardware import config, profile_for

ref = _ref()

# The example, by the lesson's arithmetic.
n_tok, v, h, b = TALK["batch"] * TALK["seq"], TALK["vocab"], TALK["hidden"], TALK["itemsize"]
logits = n_tok * v * b
per_v_h = math.ceil(v / h)
liger = ref.liger_chunk_size(n_tok, h, v)
tl = _timelines()
chain_tensors = tl["chain_peak"] / tl["logits"]
c, vc = ref.chunk_plan(n_tok, h, v, b)
g9_logits_pow2 = f"2<sup>{logits.bit_length() - 1}</sup>" if logits & (logits - 1) == 0 else f"{logits:,}"

# Measured here, on the live-tensor meter.

# Why tiles over the vocabulary: Liger's rule at the heads the benchmark measures.
bench = record(BENCH)
gemma, llama = _heads()[0], _heads()[1]
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
plan_rows = [_plan_row("notebook, CPU (fp32)", cpu["tokens"], cpu["hidden"], cpu["vocab"], 4),
             _plan_row("notebook, T4/V100 (fp16)", t4["tokens"], t4["hidden"], t4["vocab"], 2),
             _plan_row(f"{gemma} head (bf16)", gn, gh, gv, 2),
             _plan_row(f"{llama} head (bf16)", l0["tokens"], LLAMA_3_1_8B.d_model,
                       LLAMA_3_1_8B.vocab_size, 2),
             _plan_row("Gemma-2 9B, batch 8 x 4,096 (fp32)", n_tok, h, v, 4)]
plan_table = markdown_table(["problem", "N × H → V", "budget", "tile C × Vc", "", "tiles",
                                        "scratch"], plan_rows)
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
grade_rows = []
for i, chk in enumerate(checks.CHECKS, start=1):
    vis_hid = cases.get(chk.name)
    n_cases = f"{len(vis_hid[0])} + {len(vis_hid[1])}" if vis_hid else "—"
    grade_rows.append([f"{i}", f"`{chk.name}`", f"{chk.points:g}", n_cases, what[chk.name]])
grade_table = markdown_table(["ex.", "check", "points", "cases vis. + hid.", "what it tests"],
                                        grade_rows)

# The H100 record: time and memory per contender, both heads in one table.
ups = {head: _row(head, "PyTorch, loss upcast to fp32") for head in (gemma, llama)}
bench_rows = []
for name, shown in SHOWN.items():
    cells = [shown]
    for head in (gemma, llama):
        r = _row(head, name)
        cells += [f"{r['peak_mib']:,.0f}", f"{r['ms']:.1f}", f"{r['ms'] / ups[head]['ms']:.2f}×"]
    bench_rows.append(cells)
bench_table = markdown_table(["contender", f"{gemma} MiB", "ms", "× fp32 loss",
                                         f"{llama} MiB", "ms", "× fp32 loss"], bench_rows)
up = _row(gemma, "PyTorch, loss upcast to fp32")

# The budget sweep.
sweep = {head: _budget_rows(head) for head in (gemma, llama)}
fastest = {head: min(sweep[head], key=lambda dr: dr[1]["ms"]) for head in sweep}
smallest = {head: sweep[head][0] for head in sweep}
sweep_l_fast_plan = "{:,} × {:,}".format(*ref.chunk_plan(
            l0["tokens"], l0["hidden"], l0["vocab"], 2, (l0["tokens"] + l0["vocab"]) * l0["hidden"] * 2
            // fastest[llama][0]))

# The drift of dW, from the notebook's log.
log_record = record("lesson06_log")  # the notebook's H100 log, read by key from its JSON companion
log = log_record["lesson06_log"]
low = log["low"].replace("bfloat16", "bf16").replace("float16", "fp16")
drift_rows = [[f"{k}", f"{a:.1e}", f"{b_:.1e}", f"{a / b_:.1f}×"] for k, a, b_ in log["drift"]]
ln, lh, lv = log["sizes"]
chunked_gib, chunked_x = log["measured"]["chunked over tokens (ex. 2, PyTorch)"]
drift_table = markdown_table(["chunks of tokens", f"dW in {low}", "dW in fp32 (`fp32_dw`)",
                                       f"{low} / fp32"], drift_rows)
